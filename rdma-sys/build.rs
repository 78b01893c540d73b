//! Build script of `rdma-verbs-sys` (folder `rdma-sys/`).
//!
//! 1. Finds libibverbs and librdmacm (pkg-config, or `RDMA_CORE_INCLUDE_DIR` +
//!    `RDMA_CORE_LIB_DIR`).
//! 2. Runs bindgen over `wrapper.h`, with C wrappers for every `static inline`
//!    function of the headers (`wrap_static_fns`), compiled with `cc` together
//!    with `src/shim.c` (the function-like macros).
//! 3. Scans the installed headers for the names of their `static inline`
//!    functions and for `#define IBV_X IB_UVERBS_X` aliases, so the crate can
//!    re-export the aliases and its tests can prove every inline is wrapped.
//!
//! With `DOCS_RS` set nothing is probed or generated: the crate then uses the
//! committed snapshot in `src/docsrs_bindings.rs` (docs.rs has no rdma-core).

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

/// rdma-core 44 (Debian 12) is the oldest release we support.
const MIN_IBVERBS: &str = "1.14.44";
const MIN_RDMACM: &str = "1.3.44";

/// The headers whose `static inline` functions must all be callable.
const INLINE_HEADERS: &[&str] = &["infiniband/verbs.h", "rdma/rdma_cma.h", "rdma/rdma_verbs.h"];

/// `static inline` functions that exist only under a configuration we do not
/// build with (`RDMA_STATIC_PROVIDERS`, static linking of providers).
const CONDITIONAL_INLINES: &[&str] = &["__ibv_get_device_list"];

/// The exported symbols that are ABI-compat shims behind a header macro of the
/// same name. They are hidden; the crate re-exports the macro's target instead.
const COMPAT_SYMBOLS: &[&str] = &["ibv_query_port", "ibv_reg_mr", "ibv_reg_mr_iova"];

struct Libs {
    include_dirs: Vec<PathBuf>,
    ibverbs_version: String,
    rdmacm_version: String,
}

fn main() {
    for var in [
        "DOCS_RS",
        "RDMA_CORE_INCLUDE_DIR",
        "RDMA_CORE_LIB_DIR",
        "LIBCLANG_PATH",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=src/shim.c");
    println!("cargo:rustc-check-cfg=cfg(rdma_sys_docs_snapshot)");

    if env::var_os("DOCS_RS").is_some() {
        println!("cargo:rustc-cfg=rdma_sys_docs_snapshot");
        return;
    }

    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let crate_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let libs = find_libs();
    for dir in &libs.include_dirs {
        println!("cargo:include={}", dir.display());
    }
    println!(
        "cargo:rustc-env=RDMA_SYS_IBVERBS_VERSION={}",
        libs.ibverbs_version
    );
    println!(
        "cargo:rustc-env=RDMA_SYS_RDMACM_VERSION={}",
        libs.rdmacm_version
    );

    let wrapper = crate_dir.join("wrapper.h");
    generate_bindings(&libs, &wrapper, &out);
    compile_wrappers(&libs, &crate_dir, &out);
    scan_headers(&libs, &out);
}

fn fail(what: &str, detail: &str) -> ! {
    panic!(
        "\n\nrdma-verbs-sys: {what}\n\n{detail}\n\n\
         rdma-verbs-sys needs rdma-core's development files (rdma-core >= 44: libibverbs >= {MIN_IBVERBS}, \
         librdmacm >= {MIN_RDMACM}) and libclang for bindgen:\n\
         \x20 Debian/Ubuntu: apt-get install libibverbs-dev librdmacm-dev pkg-config clang libclang-dev\n\
         \x20 Fedora/RHEL:   dnf install rdma-core-devel pkgconf-pkg-config clang-devel\n\
         \x20 Arch:          pacman -S rdma-core pkgconf clang\n\
         For an install that pkg-config cannot find, set both RDMA_CORE_INCLUDE_DIR (the directory \
         holding infiniband/verbs.h) and RDMA_CORE_LIB_DIR (the directory holding libibverbs.so and \
         librdmacm.so). If libclang is installed somewhere unusual, set LIBCLANG_PATH.\n"
    )
}

fn find_libs() -> Libs {
    let inc = env::var_os("RDMA_CORE_INCLUDE_DIR").map(PathBuf::from);
    let lib = env::var_os("RDMA_CORE_LIB_DIR").map(PathBuf::from);
    match (inc, lib) {
        (Some(inc), Some(lib)) => {
            if !inc.join("infiniband/verbs.h").is_file() {
                fail(
                    "RDMA_CORE_INCLUDE_DIR does not contain infiniband/verbs.h",
                    &format!("RDMA_CORE_INCLUDE_DIR={}", inc.display()),
                );
            }
            println!("cargo:rustc-link-search=native={}", lib.display());
            println!("cargo:rustc-link-lib=ibverbs");
            println!("cargo:rustc-link-lib=rdmacm");
            Libs {
                include_dirs: vec![inc],
                ibverbs_version: "unknown".into(),
                rdmacm_version: "unknown".into(),
            }
        }
        (Some(_), None) | (None, Some(_)) => fail(
            "set both RDMA_CORE_INCLUDE_DIR and RDMA_CORE_LIB_DIR, or neither",
            "Only one of the two overrides is set.",
        ),
        (None, None) => {
            let probe = |name: &str, min: &str| {
                pkg_config::Config::new()
                    .atleast_version(min)
                    .probe(name)
                    .unwrap_or_else(|e| {
                        println!("cargo:warning=failed to probe system {name}: {e}");
                        fail(
                            &format!("pkg-config could not find {name} >= {min}"),
                            &format!("pkg-config said:\n{e}"),
                        )
                    })
            };
            let verbs = probe("libibverbs", MIN_IBVERBS);
            let cm = probe("librdmacm", MIN_RDMACM);
            let mut include_dirs = verbs.include_paths.clone();
            for dir in cm.include_paths {
                if !include_dirs.contains(&dir) {
                    include_dirs.push(dir);
                }
            }
            Libs {
                include_dirs,
                ibverbs_version: verbs.version,
                rdmacm_version: cm.version,
            }
        }
    }
}

/// Where a header really is: the include dirs first, then the compiler's defaults.
fn locate_header(libs: &Libs, rel: &str) -> PathBuf {
    let defaults = [
        PathBuf::from("/usr/local/include"),
        PathBuf::from("/usr/include"),
    ];
    libs.include_dirs
        .iter()
        .chain(defaults.iter())
        .map(|d| d.join(rel))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            fail(
                &format!("header <{rel}> not found"),
                "Looked in the pkg-config include paths, /usr/local/include and /usr/include.",
            )
        })
}

#[derive(Debug)]
struct Callbacks;

impl bindgen::callbacks::ParseCallbacks for Callbacks {
    fn include_file(&self, filename: &str) {
        bindgen::CargoCallbacks::new().include_file(filename);
    }

    /// The libc types that replace blocklisted C types are plain `Copy` data
    /// with `Debug` (libc's `extra_traits`), so unions holding them stay unions.
    fn blocklisted_type_implements_trait(
        &self,
        _name: &str,
        derive_trait: bindgen::callbacks::DeriveTrait,
    ) -> Option<bindgen::callbacks::ImplementsTrait> {
        use bindgen::callbacks::{DeriveTrait, ImplementsTrait};
        match derive_trait {
            DeriveTrait::Copy | DeriveTrait::Debug => Some(ImplementsTrait::Yes),
            _ => Some(ImplementsTrait::No),
        }
    }
}

fn generate_bindings(libs: &Libs, wrapper: &Path, out: &Path) {
    let mut builder = bindgen::Builder::default()
        .header(wrapper.to_str().expect("UTF-8 path"))
        .parse_callbacks(Box::new(Callbacks))
        // The workspace's MSRV. 1.83 and not 1.82: bindgen 0.73 emits a `const unsafe fn`
        // taking `&mut self` (`__IncompleteArrayField::as_mut`) whatever the target, and
        // `&mut` in a const fn is stable since 1.83.
        .rust_target(bindgen::RustTarget::stable(83, 0).expect("known Rust version"))
        .allowlist_function("ibv_.*|_ibv_.*|__ibv_.*|___ibv_.*|verbs_.*|rdma_.*")
        .allowlist_type("ibv_.*|_ibv_.*|_compat_ibv_.*|ib_uverbs_.*|verbs_.*|rdma_.*")
        .allowlist_var("IBV_.*|IB_UVERBS_.*|RDMA_.*|VERBS_.*")
        .allowlist_item("ib_uverbs_.*")
        // Socket, time and pthread types come from libc, so they are the same types
        // everywhere in a program.
        .blocklist_type(
            "sockaddr|sockaddr_in|sockaddr_in6|sockaddr_storage|sockaddr_ib|in_addr|in6_addr|\
             in_port_t|in_addr_t|sa_family_t|socklen_t|timespec|time_t|__time_t|__syscall_slong_t|\
             pthread_mutex_t|pthread_cond_t",
        )
        .raw_line(
            "pub use libc::{in6_addr, in_addr, in_port_t, sa_family_t, sockaddr, sockaddr_in, \
             sockaddr_in6, sockaddr_storage, socklen_t, timespec, pthread_mutex_t, pthread_cond_t};",
        )
        // Values of C enums come from the kernel and providers, which can be
        // newer than the headers: plain integer constants, never Rust enums.
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .derive_debug(true)
        .impl_debug(false)
        .layout_tests(true)
        .generate_comments(true)
        .wrap_static_fns(true)
        .wrap_static_fns_path(out.join("inline_wrappers"))
        .clang_arg(format!(
            "-I{}",
            wrapper.parent().expect("wrapper.h has a parent").display()
        ));
    for f in COMPAT_SYMBOLS {
        builder = builder.blocklist_function(f);
    }
    for dir in &libs.include_dirs {
        builder = builder.clang_arg(format!("-I{}", dir.display()));
    }
    // bindgen panics if it cannot load libclang; say what to install.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || builder.generate()));
    let bindings = match result {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => fail("bindgen failed on wrapper.h", &e.to_string()),
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            fail("bindgen could not run (is libclang installed?)", &msg)
        }
    };
    bindings
        .write_to_file(out.join("bindings.rs"))
        .unwrap_or_else(|e| fail("could not write bindings.rs", &e.to_string()));
}

fn compile_wrappers(libs: &Libs, crate_dir: &Path, out: &Path) {
    let mut build = cc::Build::new();
    build
        .file(out.join("inline_wrappers.c"))
        .file(crate_dir.join("src/shim.c"))
        .include(crate_dir)
        .warnings(false);
    for dir in &libs.include_dirs {
        build.include(dir);
    }
    build.compile("rdma_sys_inline");
    // The wrappers call into both libraries; list them after the static
    // archive so the linker resolves its references.
    println!("cargo:rustc-link-lib=ibverbs");
    println!("cargo:rustc-link-lib=rdmacm");
}

/// Names of the `static inline` functions in a header's text.
fn static_inline_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(pos) = rest.find("static inline") {
        let after = &rest[pos + "static inline".len()..];
        if let Some(paren) = after.find('(') {
            let head = &after[..paren];
            let name: String = head
                .trim_end()
                .chars()
                .rev()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            if !name.is_empty() && !names.contains(&name) {
                names.push(name);
            }
        }
        rest = after;
    }
    names
}

/// `#define IBV_X IB_UVERBS_X`-style aliases of `infiniband/verbs_api.h`:
/// (alias, target) pairs whose target is a plain identifier.
fn macro_aliases(text: &str) -> Vec<(String, String)> {
    let ident = |s: &str| {
        !s.is_empty()
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !s.starts_with(|c: char| c.is_ascii_digit())
    };
    text.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            if words.next()? != "#define" {
                return None;
            }
            let alias = words.next()?;
            let target = words.next()?;
            (words.next().is_none()
                && (alias.starts_with("IBV_") || alias.starts_with("ibv_"))
                && target.to_ascii_lowercase().starts_with("ib_uverbs_")
                && ident(alias)
                && ident(target))
            .then(|| (alias.to_string(), target.to_string()))
        })
        .collect()
}

/// Whether `code` declares `name` with `keyword` (`pub const NAME:`, ...),
/// whether or not bindgen's output went through rustfmt (without it, tokens
/// are separated by spaces: `pub const NAME : u32`). The declaration must
/// go on with one of `next` (which also rules out longer names).
fn declares(code: &str, keyword: &str, name: &str, next: &[char]) -> bool {
    let head = format!("{keyword} {name}");
    code.match_indices(&head)
        .any(|(at, _)| code[at + head.len()..].trim_start().starts_with(next))
}

fn scan_headers(libs: &Libs, out: &Path) {
    let mut rs = String::from(
        "/// Every `static inline` function of the installed `verbs.h`, `rdma_cma.h` and\n\
         /// `rdma_verbs.h`, as found by the build script, with its header.\n\
         pub const STATIC_INLINE_FUNCTIONS: &[(&str, &str)] = &[\n",
    );
    let mut refs = String::from(
        "/// Takes the address of every wrapped `static inline` function.\n\
         #[macro_export]\n#[doc(hidden)]\nmacro_rules! __rdma_sys_inline_fn_addrs {\n    () => {\n        [\n",
    );
    for rel in INLINE_HEADERS {
        let path = locate_header(libs, rel);
        println!("cargo:rerun-if-changed={}", path.display());
        let text = fs::read_to_string(&path)
            .unwrap_or_else(|e| fail(&format!("cannot read {}", path.display()), &e.to_string()));
        for name in static_inline_names(&text) {
            if CONDITIONAL_INLINES.contains(&name.as_str()) {
                continue;
            }
            writeln!(rs, "    ({name:?}, {rel:?}),").expect("write to String");
            writeln!(
                refs,
                "            ({name:?}, $crate::{name} as *const ::core::ffi::c_void),"
            )
            .expect("write to String");
        }
    }
    rs.push_str("];\n");
    refs.push_str("        ]\n    };\n}\n");

    let api = locate_header(libs, "infiniband/verbs_api.h");
    println!("cargo:rerun-if-changed={}", api.display());
    let text = fs::read_to_string(&api)
        .unwrap_or_else(|e| fail(&format!("cannot read {}", api.display()), &e.to_string()));
    // Some aliases are also defined by the headers themselves (bindgen emits those).
    let bindings = fs::read_to_string(out.join("bindings.rs"))
        .unwrap_or_else(|e| fail("cannot read bindings.rs", &e.to_string()));
    let defined = |name: &str| {
        declares(&bindings, "pub const", name, &[':'])
            || declares(&bindings, "pub type", name, &['='])
            || declares(&bindings, "pub struct", name, &['{', '('])
    };
    let mut aliases = String::new();
    for (alias, target) in macro_aliases(&text) {
        if defined(&alias) {
            continue;
        }
        writeln!(aliases, "pub use self::{target} as {alias};").expect("write to String");
    }
    let write = |name: &str, body: &str| {
        fs::write(out.join(name), body)
            .unwrap_or_else(|e| fail(&format!("cannot write {name}"), &e.to_string()))
    };
    write("static_inline_fns.rs", &(rs + &refs));
    write("macro_aliases.rs", &aliases);
}
