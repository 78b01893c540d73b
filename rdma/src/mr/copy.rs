//! The copies into and out of memory a peer may write while Rust reads or
//! writes it: relaxed atomic loads and stores, word by word where aligned,
//! so that the device's racing accesses are not a data race (a torn value
//! at worst). Their tests, with the memory they copy, are in `memory.rs`.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

/// The size of the atomic elements of [`copy_from_shared`]/[`copy_to_shared`].
pub(super) const WORD: usize = std::mem::size_of::<usize>();

/// Words per step of the copies' main loop: four independent loads per
/// iteration overlap, where one per step waits for each (measured on 1 MiB
/// reads on the host: never slower, faster in the median).
pub(super) const UNROLL: usize = 4;

/// How `len` bytes starting at `p` split into a byte-wise head (up to the
/// first `WORD`-aligned address), whole aligned words, and a byte-wise tail:
/// `(head, words)`.
fn split_aligned(p: *const u8, len: usize) -> (usize, usize) {
    // `align_offset` may answer `usize::MAX` ("cannot align"): then every
    // byte goes through the head.
    let head = p.align_offset(WORD).min(len);
    (head, (len - head) / WORD)
}

/// The word at `p`, loaded atomically (relaxed).
///
/// # Safety
/// `p` must be `WORD`-aligned and valid for reads of `WORD` bytes, and every
/// racing write to them atomic and of the same size.
#[inline(always)]
unsafe fn load_word(p: *const u8) -> usize {
    // SAFETY: aligned, valid, and accessed atomically by racing writers
    // (caller); `AtomicUsize` has the size and alignment of `usize`.
    unsafe { AtomicUsize::from_ptr(p.cast_mut().cast()).load(Ordering::Relaxed) }
}

/// Stores `w` at `p` atomically (relaxed).
///
/// # Safety
/// As [`load_word`], for writes, and every racing access atomic and of the
/// same size.
#[inline(always)]
unsafe fn store_word(p: *mut u8, w: usize) {
    // SAFETY: as in `load_word`.
    unsafe { AtomicUsize::from_ptr(p.cast()).store(w, Ordering::Relaxed) }
}

/// Copies `dst.len()` bytes from `src` with relaxed atomic loads: bytes up to
/// the first aligned word, then whole words, then bytes. Racing writers
/// outside Rust (the device) are then not a data race; the copy may see a mix
/// of old and new bytes.
///
/// # Safety
/// `src..src + dst.len()` must be valid for reads, not overlap `dst`, and every
/// write to it that may race with this copy must be atomic: the device's, or
/// [`copy_to_shared`] over the same range (so that racing accesses have the
/// same size).
pub(super) unsafe fn copy_from_shared(src: *const u8, dst: &mut [u8]) {
    let len = dst.len();
    let out = dst.as_mut_ptr();
    let (head, words) = split_aligned(src, len);
    let body_end = head + words * WORD;
    let byte = |i: usize| {
        // SAFETY: `i < len`: in bounds of `src` (caller) and `out`; an
        // `AtomicU8` has no alignment requirement; atomic against racing
        // writers (caller).
        unsafe { *out.add(i) = AtomicU8::from_ptr(src.add(i).cast_mut()).load(Ordering::Relaxed) };
    };
    // Two plain loops, not one over a chain of the two ranges: the
    // chain's state cost more than a short copy's words (callgrind).
    (0..head).for_each(byte);
    (body_end..len).for_each(byte);
    let mut i = head;
    while i + UNROLL * WORD <= body_end {
        // SAFETY: `i..i + UNROLL * WORD` is in bounds of both; `src + i` is
        // `WORD`-aligned (`split_aligned`, and `i - head` is a multiple of
        // `WORD`); racing writers are atomic (caller). `out` is written
        // unaligned.
        unsafe {
            let w: [usize; UNROLL] = std::array::from_fn(|k| load_word(src.add(i + k * WORD)));
            for (k, w) in w.into_iter().enumerate() {
                out.add(i + k * WORD).cast::<usize>().write_unaligned(w);
            }
        }
        i += UNROLL * WORD;
    }
    while i < body_end {
        // SAFETY: as above, for one word.
        unsafe {
            out.add(i)
                .cast::<usize>()
                .write_unaligned(load_word(src.add(i)))
        };
        i += WORD;
    }
}

/// Copies `src` to `dst` with relaxed atomic stores, split as in
/// [`copy_from_shared`] (aligned on `dst`).
///
/// # Safety
/// `dst..dst + src.len()` must be valid for writes, not overlap `src`, and
/// every access to it that may race with this copy must be atomic: the
/// device's, or [`copy_from_shared`] over the same range.
#[inline(always)]
pub(super) unsafe fn copy_to_shared(src: &[u8], dst: *mut u8) {
    if src.len() < WORD {
        // Fewer bytes than a word hold no whole aligned word: byte stores
        // only, the same ones the split below makes, without computing it.
        for (i, &b) in src.iter().enumerate() {
            // SAFETY: `i < src.len()`: in bounds (caller); an `AtomicU8`
            // has no alignment requirement; racing accesses are atomic
            // (caller).
            unsafe { AtomicU8::from_ptr(dst.add(i)).store(b, Ordering::Relaxed) };
        }
        return;
    }
    // SAFETY: the caller's contract, passed on.
    unsafe { copy_words_to_shared(src, dst) }
}

/// [`copy_to_shared`] of a word or more.
///
/// # Safety
/// As [`copy_to_shared`].
unsafe fn copy_words_to_shared(src: &[u8], dst: *mut u8) {
    let len = src.len();
    let from = src.as_ptr();
    let (head, words) = split_aligned(dst, len);
    let body_end = head + words * WORD;
    let byte = |i: usize| {
        // SAFETY: as in `copy_from_shared`, with the roles swapped.
        unsafe { AtomicU8::from_ptr(dst.add(i)).store(*from.add(i), Ordering::Relaxed) };
    };
    // As in `copy_from_shared`.
    (0..head).for_each(byte);
    (body_end..len).for_each(byte);
    let mut i = head;
    while i + UNROLL * WORD <= body_end {
        // SAFETY: as in `copy_from_shared`: `dst + i` is `WORD`-aligned,
        // `from` is read unaligned.
        unsafe {
            let w: [usize; UNROLL] =
                std::array::from_fn(|k| from.add(i + k * WORD).cast::<usize>().read_unaligned());
            for (k, w) in w.into_iter().enumerate() {
                store_word(dst.add(i + k * WORD), w);
            }
        }
        i += UNROLL * WORD;
    }
    while i < body_end {
        // SAFETY: as above, for one word.
        unsafe { store_word(dst.add(i), from.add(i).cast::<usize>().read_unaligned()) };
        i += WORD;
    }
}
