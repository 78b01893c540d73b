//! The build script's part for the `dlopen` feature: from the bindings (committed or generated
//! now), makes
//!
//! - `bindings_dlopen.rs`: the same items, except that each function libibverbs or librdmacm
//!   exports is no longer an `extern` declaration but a Rust function of the same name and
//!   signature that calls through a table of pointers the crate fills by `dlsym` when it loads
//!   the library (`src/dl.rs`); the tables' types and their `resolve` functions come after.
//!   Each such function is also exported as `rdma_sys_dl_<name>`.
//! - `dlopen_names.h`, included before anything else when the C wrappers are compiled: a
//!   `#pragma redefine_extname <name> rdma_sys_dl_<name>` per exported function, so the calls
//!   rdma-core's `static inline` functions make into the libraries (`ibv_reg_mr_iova2`,
//!   `_ibv_query_gid_ex`, the ABI-compat `ibv_query_port`, ...) reach those Rust functions and
//!   the archive has no undefined reference to either library.
//!
//! Which library a function comes from is told by its name: `rdma_*` from librdmacm, the
//! rest (`ibv_*`, `_ibv_*`, `verbs_*`) from libibverbs. `rdma_sys_*` are the crate's own C
//! functions (`src/shim.c`) and the `static inline` wrappers (`link_name = "..__extern"`) are
//! compiled C as well: both stay `extern` declarations.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use quote::ToTokens;

/// The exported functions the headers' `static inline` functions call but the bindings do not
/// bind under their own name (the ABI-compat symbols behind header macros, `COMPAT_SYMBOLS`):
/// reached only from C. Their pointer arguments are typed loosely: only C calls them.
const C_ONLY: &[&str] = &[
    "pub fn ibv_query_port(context: *mut ibv_context, port_num: u8, \
     port_attr: *mut ::core::ffi::c_void) -> ::core::ffi::c_int;",
    "pub fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut ::core::ffi::c_void, length: usize, \
     access: ::core::ffi::c_int) -> *mut ibv_mr;",
    "pub fn ibv_reg_mr_iova(pd: *mut ibv_pd, addr: *mut ::core::ffi::c_void, length: usize, \
     iova: u64, access: ::core::ffi::c_int) -> *mut ibv_mr;",
];

#[derive(Clone, Copy, PartialEq)]
enum Lib {
    Ibverbs,
    Rdmacm,
}

impl Lib {
    fn of(name: &str) -> Lib {
        if name.starts_with("rdma_") {
            Lib::Rdmacm
        } else {
            Lib::Ibverbs
        }
    }

    fn table(self) -> &'static str {
        match self {
            Lib::Ibverbs => "IbverbsFns",
            Lib::Rdmacm => "RdmacmFns",
        }
    }

    fn getter(self) -> &'static str {
        match self {
            Lib::Ibverbs => "ibverbs",
            Lib::Rdmacm => "rdmacm",
        }
    }
}

/// One function resolved by `dlsym`.
struct Entry {
    /// The C symbol.
    symbol: String,
    /// The table's field (the symbol, or `compat_<symbol>` for `C_ONLY`).
    field: String,
    lib: Lib,
    /// `unsafe extern "C" fn(..) -> ..`
    fn_type: String,
    /// `(a: A, b: B) -> R`
    signature: String,
    /// `a, b`
    args: String,
    /// The doc and other attributes the bindings gave it.
    attrs: String,
    /// Bound under its name (`pub`), or reached from C only.
    public: bool,
}

fn is_wrapper(f: &syn::ForeignItemFn) -> bool {
    f.attrs.iter().any(|a| {
        a.path().is_ident("link_name") && a.to_token_stream().to_string().contains("__extern")
    })
}

fn entry(f: &syn::ForeignItemFn, public: bool) -> Entry {
    let symbol = f.sig.ident.to_string();
    if let Some(v) = &f.sig.variadic {
        super::fail(
            "dlopen: a variadic function in the bindings",
            &format!(
                "{symbol} takes `{}`: a forwarder cannot pass it on",
                v.to_token_stream()
            ),
        );
    }
    let mut tys = Vec::new();
    let mut args = Vec::new();
    for input in &f.sig.inputs {
        match input {
            syn::FnArg::Typed(p) => {
                tys.push(p.ty.to_token_stream().to_string());
                args.push(p.pat.to_token_stream().to_string());
            }
            syn::FnArg::Receiver(_) => super::fail("dlopen: a method in an extern block", &symbol),
        }
    }
    let output = f.sig.output.to_token_stream().to_string();
    let params = f
        .sig
        .inputs
        .iter()
        .map(|i| i.to_token_stream().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let attrs = f
        .attrs
        .iter()
        .map(|a| a.to_token_stream().to_string())
        .collect::<Vec<_>>()
        .join("\n");
    Entry {
        field: if public {
            symbol.clone()
        } else {
            format!("compat_{symbol}")
        },
        lib: Lib::of(&symbol),
        fn_type: format!("unsafe extern \"C\" fn({}) {output}", tys.join(", ")),
        signature: format!("({params}) {output}"),
        args: args.join(", "),
        attrs,
        public,
        symbol,
    }
}

/// Writes `bindings_dlopen.rs` and `dlopen_names.h` into `out` from `bindings`.
pub fn generate(bindings: &Path, out: &Path) {
    let text = fs::read_to_string(bindings)
        .unwrap_or_else(|e| super::fail("cannot read the bindings", &e.to_string()));
    let file = syn::parse_file(&text)
        .unwrap_or_else(|e| super::fail("dlopen: cannot parse the bindings", &e.to_string()));

    let mut rs = String::from(
        "// Generated by rdma-verbs-sys's build script (build/dlopen.rs) from the bindings.\n",
    );
    for attr in &file.attrs {
        writeln!(rs, "{}", attr.to_token_stream()).expect("write to String");
    }
    let mut entries = Vec::new();
    for item in file.items {
        match item {
            syn::Item::ForeignMod(mut block) => {
                let mut kept = Vec::new();
                for foreign in block.items {
                    match foreign {
                        syn::ForeignItem::Fn(f)
                            if !is_wrapper(&f)
                                && !f.sig.ident.to_string().starts_with("rdma_sys_") =>
                        {
                            entries.push(entry(&f, true))
                        }
                        other => kept.push(other),
                    }
                }
                if !kept.is_empty() {
                    block.items = kept;
                    writeln!(rs, "{}", block.to_token_stream()).expect("write to String");
                }
            }
            other => writeln!(rs, "{}", other.to_token_stream()).expect("write to String"),
        }
    }
    for decl in C_ONLY {
        let f: syn::ForeignItemFn = syn::parse_str(decl).expect("C_ONLY parses");
        if entries.iter().any(|e| f.sig.ident == e.symbol) {
            continue;
        }
        entries.push(entry(&f, false));
    }

    let mut header = String::from(
        "/* Generated by rdma-verbs-sys's build script (build/dlopen.rs): with the dlopen\n \
         * feature, the C wrappers' calls into libibverbs and librdmacm go to the crate's\n \
         * forwarders, which call through the table loaded by dlopen. */\n\
         #ifndef __PRAGMA_REDEFINE_EXTNAME\n\
         #error \"rdma-verbs-sys's dlopen feature needs a C compiler with #pragma redefine_extname (GCC, Clang)\"\n\
         #endif\n",
    );
    for e in &entries {
        writeln!(
            header,
            "#pragma redefine_extname {0} rdma_sys_dl_{0}",
            e.symbol
        )
        .expect("write to String");
    }

    // The forwarders.
    for e in &entries {
        let vis = if e.public { "pub " } else { "" };
        let lib = e.lib.getter();
        writeln!(
            rs,
            "{attrs}\n\
             #[export_name = \"rdma_sys_dl_{sym}\"]\n\
             {vis}unsafe extern \"C\" fn {name}{sig} {{\n\
             \x20   let f = match crate::dl::{lib}().{field} {{\n\
             \x20       Some(f) => f,\n\
             \x20       None => crate::dl::missing_symbol(crate::dl::Library::{libname}, \"{sym}\"),\n\
             \x20   }};\n\
             \x20   // SAFETY: `f` is the library's `{sym}`, resolved by name from it with the\n\
             \x20   // bindings' signature; the caller keeps the C function's contract.\n\
             \x20   unsafe {{ f({args}) }}\n\
             }}",
            attrs = e.attrs,
            sym = e.symbol,
            name = if e.public {
                e.symbol.clone()
            } else {
                format!("rdma_sys_dl_{}", e.symbol)
            },
            sig = e.signature,
            field = e.field,
            libname = match e.lib {
                Lib::Ibverbs => "Ibverbs",
                Lib::Rdmacm => "Rdmacm",
            },
            args = e.args,
        )
        .expect("write to String");
    }

    // The tables.
    for lib in [Lib::Ibverbs, Lib::Rdmacm] {
        let table = lib.table();
        writeln!(
            rs,
            "/// The functions of one library, each `None` when the library lacks it.\n\
             pub(crate) struct {table} {{"
        )
        .expect("write to String");
        for e in entries.iter().filter(|e| e.lib == lib) {
            writeln!(rs, "    pub(crate) {}: Option<{}>,", e.field, e.fn_type).expect("write");
        }
        writeln!(
            rs,
            "}}\n\
             impl {table} {{\n\
             \x20   /// Looks every function up in `lib`.\n\
             \x20   ///\n\
             \x20   /// # Safety\n\
             \x20   /// `lib` is the library these bindings describe.\n\
             \x20   pub(crate) unsafe fn resolve(lib: &::libloading::Library) -> Self {{\n\
             \x20       Self {{"
        )
        .expect("write to String");
        for e in entries.iter().filter(|e| e.lib == lib) {
            writeln!(
                rs,
                "            // SAFETY: the type is the bindings' signature of this symbol.\n\
                 \x20           {field}: unsafe {{ lib.get::<{ty}>(b\"{sym}\\0\") }}.ok().map(|s| *s),",
                field = e.field,
                ty = e.fn_type,
                sym = e.symbol,
            )
            .expect("write to String");
        }
        writeln!(
            rs,
            "        }}\n    }}\n\
             \x20   /// The functions the library did not export.\n\
             \x20   #[allow(dead_code)]\n\
             \x20   pub(crate) fn missing(&self) -> Vec<&'static str> {{\n\
             \x20       let mut missing = Vec::new();"
        )
        .expect("write to String");
        for e in entries.iter().filter(|e| e.lib == lib) {
            writeln!(
                rs,
                "        if self.{}.is_none() {{ missing.push(\"{}\"); }}",
                e.field, e.symbol
            )
            .expect("write to String");
        }
        writeln!(rs, "        missing\n    }}\n}}").expect("write to String");
    }

    let write = |name: &str, body: &str| {
        fs::write(out.join(name), body)
            .unwrap_or_else(|e| super::fail(&format!("cannot write {name}"), &e.to_string()))
    };
    write("bindings_dlopen.rs", &rs);
    write("dlopen_names.h", &header);
}
