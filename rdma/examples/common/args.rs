//! The examples' one command-line parser, `getopt_long(3)`-style, and the
//! number formats of the C tools' flags.

use super::Res;

/// One flag a tool accepts.
#[derive(Debug, Clone, Copy)]
pub struct Flag {
    /// `-x` (`None`: long form only).
    pub short: Option<char>,
    /// `--name` (`""`: short form only).
    pub long: &'static str,
    /// Whether it takes a value.
    pub value: bool,
}

impl Flag {
    /// A flag with both forms.
    pub const fn new(short: char, long: &'static str, value: bool) -> Flag {
        Flag {
            short: Some(short),
            long,
            value,
        }
    }
}

/// A flag found on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Its index in the table given to [`parse`].
    pub index: usize,
    /// How it was written (`-n` or `--iters`), for messages.
    pub shown: String,
    /// Its value (`""` for a flag that takes none).
    pub value: String,
}

/// What [`parse`] found: the flags in command-line order, and the operands.
#[derive(Debug, Default)]
pub struct Parsed {
    /// The flags, in order.
    pub flags: Vec<Found>,
    /// The operands (anything that is not a flag or its value), in order.
    pub operands: Vec<String>,
}

/// Parses `args` (without the program name) as `getopt_long(3)` does:
/// clustered short flags (`-ec`), attached or separate values (`-n50`,
/// `-n 50`), `--long=value` or `--long value`, unique prefixes of long
/// names, `--` to end the flags, and operands anywhere.
///
/// # Errors
/// The unknown flag, an ambiguous prefix, a missing or unwanted value, in
/// `getopt_long`'s words.
pub fn parse(args: impl IntoIterator<Item = String>, table: &[Flag]) -> Res<Parsed> {
    let mut out = Parsed::default();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "--" {
            out.operands.extend(args.by_ref());
            break;
        }
        if let Some(long) = arg.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            let exact = table
                .iter()
                .position(|f| !f.long.is_empty() && f.long == name);
            let prefixed: Vec<usize> = (0..table.len())
                .filter(|&i| !table[i].long.is_empty() && table[i].long.starts_with(name))
                .collect();
            let index = match (exact, prefixed.as_slice()) {
                (Some(i), _) => i,
                (None, [i]) if !name.is_empty() => *i,
                (None, []) | (None, [_]) => return Err(format!("unrecognized option '--{name}'")),
                (None, _) => return Err(format!("option '--{name}' is ambiguous")),
            };
            let flag = table[index];
            let shown = format!("--{}", flag.long);
            let value = match (flag.value, inline) {
                (true, Some(v)) => v,
                (true, None) => args
                    .next()
                    .ok_or_else(|| format!("option '{shown}' requires an argument"))?,
                (false, Some(_)) => {
                    return Err(format!("option '{shown}' doesn't allow an argument"))
                }
                (false, None) => String::new(),
            };
            out.flags.push(Found {
                index,
                shown,
                value,
            });
        } else if let Some(cluster) = arg.strip_prefix('-').filter(|c| !c.is_empty()) {
            for (at, c) in cluster.char_indices() {
                let index = table
                    .iter()
                    .position(|f| f.short == Some(c))
                    .ok_or_else(|| format!("invalid option -- '{c}'"))?;
                let shown = format!("-{c}");
                if table[index].value {
                    let rest = &cluster[at + c.len_utf8()..];
                    let value = if rest.is_empty() {
                        args.next()
                            .ok_or_else(|| format!("option requires an argument -- '{c}'"))?
                    } else {
                        rest.to_string()
                    };
                    out.flags.push(Found {
                        index,
                        shown,
                        value,
                    });
                    break;
                }
                out.flags.push(Found {
                    index,
                    shown,
                    value: String::new(),
                });
            }
        } else {
            out.operands.push(arg);
        }
    }
    Ok(out)
}

/// POSIX `getopt(3)` with a `spec` string (`"a:b"`: `-a` takes a value,
/// `-b` does not), for the tools that take no operands: the flags as
/// `(letter, value)`.
///
/// # Errors
/// As [`parse`], and any operand.
pub fn getopt(args: &[String], spec: &str) -> Res<Vec<(char, Option<String>)>> {
    let mut table = Vec::new();
    let mut chars = spec.chars().peekable();
    while let Some(c) = chars.next() {
        let value = chars.next_if_eq(&':').is_some();
        table.push(Flag {
            short: Some(c),
            long: "",
            value,
        });
    }
    let parsed = parse(args.iter().cloned(), &table)?;
    if let Some(op) = parsed.operands.first() {
        return Err(format!("unexpected argument '{op}'"));
    }
    Ok(parsed
        .flags
        .into_iter()
        .map(|f| {
            let c = table[f.index].short.unwrap_or('?');
            (c, table[f.index].value.then_some(f.value))
        })
        .collect())
}

/// A number as C's `strtoul(s, NULL, 0)` accepts it: decimal, `0x`
/// hexadecimal or `0` octal; unlike `strtoul`, trailing junk is refused.
pub fn parse_c_number(s: &str) -> Option<u64> {
    let s = s.trim();
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16).ok()
    } else if s.len() > 1 && s.starts_with('0') {
        u64::from_str_radix(&s[1..], 8).ok()
    } else {
        s.parse().ok()
    }
}

/// [`parse_c_number`] for flag `-{flag}`.
///
/// # Errors
/// Text that is not a number.
pub fn c_number(flag: char, v: &str) -> Res<u64> {
    parse_c_number(v).ok_or_else(|| format!("invalid number '{v}' for -{flag}"))
}

/// A decimal number, as the C tools read them with `atoi(3)`, except that
/// what `atoi` would silently turn into 0 or truncate is refused.
///
/// # Errors
/// Text that is not a whole decimal number.
pub fn number<T: std::str::FromStr>(flag: char, v: &str) -> Res<T> {
    v.trim()
        .parse()
        .map_err(|_| format!("invalid number '{v}' for -{flag}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn long_and_short_forms() {
        let table = [
            Flag::new('n', "iters", true),
            Flag::new('e', "events", false),
            Flag {
                short: None,
                long: "sysfs",
                value: false,
            },
        ];
        let p = parse(
            args(&["-en5", "host", "--it=7", "--sys", "--", "-x"]),
            &table,
        )
        .unwrap();
        let got: Vec<(usize, &str)> = p.flags.iter().map(|f| (f.index, &f.value[..])).collect();
        assert_eq!(got, [(1, ""), (0, "5"), (0, "7"), (2, "")]);
        assert_eq!(p.operands, ["host", "-x"]);
        for (bad, msg) in [
            (&["--bogus"][..], "unrecognized option '--bogus'"),
            (&["-x"], "invalid option -- 'x'"),
            (&["-n"], "option requires an argument -- 'n'"),
            (&["--iters"], "option '--iters' requires an argument"),
            (
                &["--events=1"],
                "option '--events' doesn't allow an argument",
            ),
        ] {
            assert_eq!(parse(args(bad), &table).unwrap_err(), msg);
        }
    }

    #[test]
    fn getopt_spec_strings() {
        let f = getopt(&args(&["-p7174", "-v", "-s", "a"]), "s:p:v").unwrap();
        assert_eq!(
            f,
            [
                ('p', Some("7174".into())),
                ('v', None),
                ('s', Some("a".into()))
            ]
        );
        assert!(getopt(&args(&["x"]), "s:").is_err());
        assert!(getopt(&args(&["-s"]), "s:").is_err());
    }

    #[test]
    fn c_numbers() {
        assert_eq!(parse_c_number("0x1f"), Some(31));
        assert_eq!(parse_c_number("010"), Some(8));
        assert_eq!(parse_c_number("0"), Some(0));
        assert_eq!(parse_c_number("12z"), None);
        assert!(number::<u32>('c', "-1").is_err());
    }
}
