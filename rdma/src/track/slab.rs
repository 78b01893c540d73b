//! The in-flight receives of a shared receive queue, by slot.
//!
//! An SRQ's receives complete in any order (several QPs take from it, on
//! several CQs), and a completion can be lost for good (a CQ destroyed with
//! it unpolled, a provider that discards it). So they are kept by index, not
//! in posting order: the sequence field of the `wr_id` is the slot, and a
//! completion finds its entry in constant time whatever happened to others.

use super::Pending;

#[derive(Debug, Default)]
pub(crate) struct Slab {
    slots: Vec<Option<Pending>>,
    /// Empty slots below `slots.len()`, reused last-freed first.
    free: Vec<u32>,
}

impl Slab {
    /// Stores `p`; returns its slot, or gives `p` back when 2^32 receives are
    /// in flight.
    pub fn insert(&mut self, p: Pending) -> Result<u32, Pending> {
        if let Some(i) = self.free.pop() {
            self.slots[i as usize] = Some(p);
            return Ok(i);
        }
        let Ok(i) = u32::try_from(self.slots.len()) else {
            return Err(p);
        };
        self.slots.push(Some(p));
        Ok(i)
    }

    /// Takes the entry in slot `i`, if there is one.
    pub fn remove(&mut self, i: u32) -> Option<Pending> {
        let p = self.slots.get_mut(i as usize)?.take()?;
        self.free.push(i);
        Some(p)
    }

    /// The entry in slot `i`, if there is one.
    pub fn get(&self, i: u32) -> Option<&Pending> {
        self.slots.get(i as usize)?.as_ref()
    }

    /// Entries in flight.
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Takes every entry.
    pub fn drain(&mut self) -> Vec<Pending> {
        self.free.clear();
        self.slots.drain(..).flatten().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(wr_id: u64) -> Pending {
        Pending {
            wr_id,
            buffers: crate::WrBuffers::None,
            _ah: None,
            _bind: None,
        }
    }

    #[test]
    fn slots_are_reused_and_each_entry_found_once() {
        let mut s = Slab::default();
        let a = s.insert(p(1)).unwrap();
        let b = s.insert(p(2)).unwrap();
        assert_ne!(a, b);
        assert_eq!(s.remove(a).map(|p| p.wr_id), Some(1));
        assert!(s.remove(a).is_none(), "taken once");
        assert!(s.remove(99).is_none(), "never used");
        let c = s.insert(p(3)).unwrap();
        assert_eq!(c, a, "the freed slot is reused");
        assert_eq!(s.len(), 2);
        let mut left: Vec<u64> = s.drain().into_iter().map(|p| p.wr_id).collect();
        left.sort_unstable();
        assert_eq!(left, [2, 3]);
        assert_eq!(s.len(), 0);
    }
}
