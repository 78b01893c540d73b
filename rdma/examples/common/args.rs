//! The examples' one command-line parser (`perf` includes this file too):
//! a table of [`Flag`]s read the way `getopt_long(3)` reads the C tools'
//! command lines, so that a C tool and its port take the same arguments,
//! with `-h`/`--help` listing the table, and errors that name the argument
//! that was wrong.
//!
//! A tool describes its command line as a [`Cli`], reads it with
//! [`Cli::read`] (or [`Cli::parse`] in tests), and turns each [`Found`] flag
//! into its options with the value readers of [`Found`] (C number forms,
//! ranges), whose errors say which flag got which value.
#![allow(dead_code)] // every tool uses a different subset

use std::fmt;
use std::process::ExitCode;

/// One flag a tool accepts. `K` is what the tool matches on when reading
/// the flags it was given: a `char` for the tools with only short flags,
/// a tool's own enum otherwise.
#[derive(Debug, Clone, Copy)]
pub struct Flag<'a, K> {
    /// What [`Found::key`] is when this flag is given.
    pub key: K,
    /// `-x` (`None`: long form only).
    pub short: Option<char>,
    /// `--name` (`""`: short form only).
    pub long: &'a str,
    /// The placeholder of its value in the help (`None`: it takes none).
    pub value: Option<&'a str>,
    /// Its line in the help.
    pub help: &'a str,
}

impl<'a, K> Flag<'a, K> {
    /// A flag without a value; `long` may be `""`.
    pub const fn switch(key: K, short: char, long: &'a str, help: &'a str) -> Self {
        Flag {
            key,
            short: Some(short),
            long,
            value: None,
            help,
        }
    }

    /// A flag with a value shown as `<value>` in the help; `long` may be `""`.
    pub const fn value(key: K, short: char, long: &'a str, value: &'a str, help: &'a str) -> Self {
        Flag {
            key,
            short: Some(short),
            long,
            value: Some(value),
            help,
        }
    }

    /// How the help spells it: `-n, --iters=<n>`, `-s <size>`, `    --raw`.
    fn spelled(&self) -> String {
        let short = self.short.map(|c| format!("-{c}"));
        let mut s = match (short, self.long) {
            (Some(s), "") => s,
            (Some(s), long) => format!("{s}, --{long}"),
            (None, long) => format!("    --{long}"),
        };
        if let Some(v) = self.value {
            s.push_str(&if self.long.is_empty() {
                format!(" <{v}>")
            } else {
                format!("=<{v}>")
            });
        }
        s
    }
}

/// A tool's command line: its name, what it is called with, and its flags.
#[derive(Debug, Clone, Copy)]
pub struct Cli<'a, K> {
    /// The tool's name, in front of its error messages.
    pub name: &'a str,
    /// The lines after `Usage:` in the help: how the tool is called, and
    /// anything to know beyond the flags.
    pub usage: &'a str,
    /// The flags. `-h`/`--help` is added unless the table uses them.
    pub flags: &'a [Flag<'a, K>],
    /// The exit status for a command line that is not accepted (the C
    /// tool's, where it has one).
    pub bad_exit: u8,
}

/// Why a command line was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgError {
    /// `-h`/`--help`: the caller prints [`Cli::help`] and succeeds.
    Help,
    /// A bad flag, value or operand: what was wrong, naming the argument.
    Bad(String),
}

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgError::Help => f.write_str("help requested"),
            ArgError::Bad(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for ArgError {}

/// A bad command line, with `msg` saying what was wrong.
pub fn bad<T>(msg: impl Into<String>) -> Result<T, ArgError> {
    Err(ArgError::Bad(msg.into()))
}

/// A flag found on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found<K> {
    /// The flag's [`Flag::key`].
    pub key: K,
    /// How it was written (`-n` or `--iters`), for messages.
    pub shown: String,
    /// Its value (`""` for a flag that takes none).
    pub value: String,
}

/// What [`Cli::parse`] found: the flags in command-line order, and the
/// operands.
#[derive(Debug)]
pub struct Parsed<K> {
    /// The flags, in order.
    pub flags: Vec<Found<K>>,
    /// The operands (anything that is not a flag or its value), in order.
    pub operands: Vec<String>,
}

impl<K> Parsed<K> {
    /// Refuses operands, for the tools that take none.
    ///
    /// # Errors
    /// The first operand.
    pub fn no_operands(&self) -> Result<(), ArgError> {
        match self.operands.first() {
            Some(op) => bad(format!("unexpected argument '{op}'")),
            None => Ok(()),
        }
    }
}

impl<K: Copy> Cli<'_, K> {
    /// The help: `Usage:`, the usage lines, and one line per flag.
    pub fn help(&self) -> String {
        let mut s = format!("Usage:\n{}\n\nOptions:\n", self.usage.trim_end());
        let help = self
            .implicit_help()
            .then_some(("-h, --help".to_string(), "print this text"));
        let lines = self.flags.iter().map(|f| (f.spelled(), f.help)).chain(help);
        for (spelled, text) in lines {
            if spelled.len() < 26 {
                s.push_str(&format!("  {spelled:<26}{text}\n"));
            } else {
                s.push_str(&format!("  {spelled}\n  {:26}{text}\n", ""));
            }
        }
        s
    }

    /// Whether `-h`/`--help` are ours (the table uses neither).
    fn implicit_help(&self) -> bool {
        !self
            .flags
            .iter()
            .any(|f| f.short == Some('h') || f.long == "help")
    }

    /// Parses `args` (without the program name) as `getopt_long(3)` does:
    /// clustered short flags (`-ec`), attached or separate values (`-n50`,
    /// `-n 50`), `--long=value` or `--long value`, unique prefixes of long
    /// names, `--` to end the flags, and operands anywhere.
    ///
    /// # Errors
    /// [`ArgError::Help`] for `-h`/`--help`; [`ArgError::Bad`] for an
    /// unknown flag, an ambiguous prefix, a missing or unwanted value, in
    /// `getopt_long`'s words.
    pub fn parse(&self, args: impl IntoIterator<Item = String>) -> Result<Parsed<K>, ArgError> {
        let table = self.flags;
        let help = self.implicit_help();
        let mut out = Parsed {
            flags: Vec::new(),
            operands: Vec::new(),
        };
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
                if help && !name.is_empty() && "help".starts_with(name) {
                    return Err(ArgError::Help);
                }
                let exact = table
                    .iter()
                    .position(|f| !f.long.is_empty() && f.long == name);
                let prefixed: Vec<usize> = (0..table.len())
                    .filter(|&i| !table[i].long.is_empty() && table[i].long.starts_with(name))
                    .collect();
                let index = match (exact, prefixed.as_slice()) {
                    (Some(i), _) => i,
                    (None, [i]) if !name.is_empty() => *i,
                    (None, []) | (None, [_]) => {
                        return bad(format!("unrecognized option '--{name}'"))
                    }
                    (None, _) => return bad(format!("option '--{name}' is ambiguous")),
                };
                let flag = &table[index];
                let shown = format!("--{}", flag.long);
                let value = match (flag.value.is_some(), inline) {
                    (true, Some(v)) => v,
                    (true, None) => match args.next() {
                        Some(v) => v,
                        None => return bad(format!("option '{shown}' requires an argument")),
                    },
                    (false, Some(_)) => {
                        return bad(format!("option '{shown}' doesn't allow an argument"))
                    }
                    (false, None) => String::new(),
                };
                out.flags.push(Found {
                    key: flag.key,
                    shown,
                    value,
                });
            } else if let Some(cluster) = arg.strip_prefix('-').filter(|c| !c.is_empty()) {
                for (at, c) in cluster.char_indices() {
                    let Some(flag) = table.iter().find(|f| f.short == Some(c)) else {
                        if help && c == 'h' {
                            return Err(ArgError::Help);
                        }
                        return bad(format!("invalid option -- '{c}'"));
                    };
                    let shown = format!("-{c}");
                    if flag.value.is_some() {
                        let rest = &cluster[at + c.len_utf8()..];
                        let value = if !rest.is_empty() {
                            rest.to_string()
                        } else if let Some(v) = args.next() {
                            v
                        } else {
                            return bad(format!("option requires an argument -- '{c}'"));
                        };
                        out.flags.push(Found {
                            key: flag.key,
                            shown,
                            value,
                        });
                        break;
                    }
                    out.flags.push(Found {
                        key: flag.key,
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

    /// Reads the process's command line with [`Cli::parse`] and `read`
    /// (which turns the flags into the tool's options). `-h` prints the help
    /// on stdout and gives `Err(0)`; a command line not accepted prints
    /// `NAME: what was wrong` and the help on stderr and gives
    /// `Err(bad_exit)`: the caller returns that exit status.
    pub fn read<O>(
        &self,
        read: impl FnOnce(Parsed<K>) -> Result<O, ArgError>,
    ) -> Result<O, ExitCode> {
        match self.parse(std::env::args().skip(1)).and_then(read) {
            Ok(o) => Ok(o),
            Err(ArgError::Help) => {
                print!("{}", self.help());
                Err(ExitCode::SUCCESS)
            }
            Err(ArgError::Bad(msg)) => {
                eprintln!("{}: {msg}", self.name);
                eprint!("{}", self.help());
                Err(ExitCode::from(self.bad_exit))
            }
        }
    }
}

impl<K> Found<K> {
    /// The error for a value this flag does not take: `invalid value "x"
    /// for -n: expected {expected}`.
    pub fn bad(&self, expected: impl fmt::Display) -> ArgError {
        ArgError::Bad(format!(
            "invalid value {:?} for {}: expected {expected}",
            self.value, self.shown
        ))
    }

    /// The value as a decimal number, as the C tools read them with
    /// `atoi(3)`, except that what `atoi` would silently turn into 0 or
    /// truncate is refused.
    ///
    /// # Errors
    /// Text that is not such a number of type `T`.
    pub fn number<T: std::str::FromStr>(&self, expected: &str) -> Result<T, ArgError> {
        self.value.trim().parse().map_err(|_| self.bad(expected))
    }

    /// The value as C's `strtoul(s, NULL, 0)` reads it ([`c_number`]).
    ///
    /// # Errors
    /// Text that is not such a number of type `T`.
    pub fn c_number<T: TryFrom<u64>>(&self, expected: &str) -> Result<T, ArgError> {
        c_number(&self.value)
            .and_then(|n| T::try_from(n).ok())
            .ok_or_else(|| self.bad(expected))
    }

    /// `n` if it lies in `lo..=hi`.
    ///
    /// # Errors
    /// `{flag} must be between {lo} and {hi}, got {n}`.
    pub fn in_range<T: PartialOrd + fmt::Display>(
        &self,
        n: T,
        lo: T,
        hi: T,
    ) -> Result<T, ArgError> {
        if n < lo || n > hi {
            bad(format!(
                "{} must be between {lo} and {hi}, got {n}",
                self.shown
            ))
        } else {
            Ok(n)
        }
    }
}

/// A number as C's `strtoul(s, NULL, 0)` accepts it: decimal, `0x`
/// hexadecimal or `0` octal; unlike `strtoul`, trailing junk is refused.
pub fn c_number(s: &str) -> Option<u64> {
    let s = s.trim();
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16).ok()
    } else if s.len() > 1 && s.starts_with('0') {
        u64::from_str_radix(&s[1..], 8).ok()
    } else {
        s.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    const TABLE: &[Flag<'static, u8>] = &[
        Flag::value(0, 'n', "iters", "n", "iterations"),
        Flag::switch(1, 'e', "events", "sleep"),
        Flag {
            key: 2,
            short: None,
            long: "sysfs",
            value: None,
            help: "sysfs only",
        },
        Flag::value(3, 's', "", "size", "bytes"),
    ];
    const CLI: Cli<'static, u8> = Cli {
        name: "t",
        usage: "  t [options]",
        flags: TABLE,
        bad_exit: 1,
    };

    #[test]
    fn long_and_short_forms() {
        let p = CLI
            .parse(args(&[
                "-en5", "host", "--it=7", "--sys", "-s", "9", "--", "-x",
            ]))
            .unwrap();
        let got: Vec<(u8, &str)> = p.flags.iter().map(|f| (f.key, &f.value[..])).collect();
        assert_eq!(got, [(1, ""), (0, "5"), (0, "7"), (2, ""), (3, "9")]);
        assert_eq!(p.operands, ["host", "-x"]);
        assert_eq!(p.no_operands(), bad("unexpected argument 'host'"));
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
            assert_eq!(CLI.parse(args(bad)).unwrap_err(), ArgError::Bad(msg.into()));
        }
    }

    #[test]
    fn help_lists_every_flag() {
        for h in ["-h", "--help", "--he", "-eh"] {
            assert_eq!(CLI.parse(args(&[h])).unwrap_err(), ArgError::Help, "{h}");
        }
        let help = CLI.help();
        assert!(help.starts_with("Usage:\n  t [options]\n"), "{help}");
        for line in [
            "-n, --iters=<n>",
            "-e, --events",
            "    --sysfs",
            "-s <size>",
            "-h, --help",
        ] {
            assert!(help.contains(line), "{line} missing from\n{help}");
        }
        // A table that has -h keeps it.
        let own = [Flag::switch(9u8, 'h', "", "hosts")];
        let cli = Cli { flags: &own, ..CLI };
        assert_eq!(cli.parse(args(&["-h"])).unwrap().flags[0].key, 9);
        assert!(cli.parse(args(&["--help"])).is_err());
    }

    #[test]
    fn values_name_the_flag() {
        let p = CLI.parse(args(&["-n", "0x1f", "--iters=12z"])).unwrap();
        assert_eq!(p.flags[0].c_number::<u8>("a count"), Ok(31));
        assert_eq!(
            p.flags[1].number::<u32>("a count"),
            bad("invalid value \"12z\" for --iters: expected a count")
        );
        assert_eq!(
            p.flags[0].in_range(31, 1, 8),
            bad("-n must be between 1 and 8, got 31")
        );
        assert!(p.flags[0].number::<u32>("").is_err());
    }

    #[test]
    fn c_numbers() {
        assert_eq!(c_number("0x1f"), Some(31));
        assert_eq!(c_number("010"), Some(8));
        assert_eq!(c_number("0"), Some(0));
        assert_eq!(c_number("12z"), None);
    }
}
