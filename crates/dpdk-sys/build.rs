//! Finds the system DPDK with pkg-config, generates bindings with bindgen,
//! and compiles the C shim. Does nothing without the `dpdk` feature.

fn main() {
    println!("cargo:rerun-if-changed=src/shim.h");
    println!("cargo:rerun-if-changed=src/shim.c");
    #[cfg(feature = "dpdk")]
    build::run();
}

#[cfg(feature = "dpdk")]
mod build {
    use std::path::PathBuf;

    pub fn run() {
        let lib = pkg_config::Config::new()
            .atleast_version("22.11")
            .probe("libdpdk")
            .unwrap_or_else(|e| {
                panic!(
                    "DPDK not found ({e}).\n\
                     The `dpdk` feature needs the system DPDK: `apt-get install libdpdk-dev` \
                     (Debian 12 ships DPDK 22.11 LTS), and libclang for bindgen \
                     (`apt-get install libclang-dev`)."
                )
            });
        let mut cc = cc::Build::new();
        cc.file("src/shim.c")
            .warnings(true)
            .flag_if_supported("-Wno-unused-parameter");
        // DPDK's pkg-config cflags carry `-include rte_config.h` and
        // `-march=...`: pass them on to the shim and to clang.
        let cflags = pkg_config::get_variable("libdpdk", "cflags").unwrap_or_default();
        let mut clang_args: Vec<String> = Vec::new();
        for p in &lib.include_paths {
            cc.include(p);
            clang_args.push(format!("-I{}", p.display()));
        }
        let extra = std::process::Command::new("pkg-config")
            .args(["--cflags-only-other", "libdpdk"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or(cflags);
        let mut it = extra.split_whitespace();
        while let Some(f) = it.next() {
            if f == "-include" {
                if let Some(h) = it.next() {
                    cc.flag("-include").flag(h);
                    clang_args.push("-include".into());
                    clang_args.push(h.into());
                }
            } else {
                cc.flag_if_supported(f);
                clang_args.push(f.into());
            }
        }
        cc.compile("xio_dpdk_shim");

        let bindings = bindgen::Builder::default()
            .header("src/shim.h")
            .clang_args(&clang_args)
            .allowlist_function("rte_eal_init|rte_eal_cleanup|rte_eal_process_type")
            .allowlist_function("rte_strerror|rte_socket_id|rte_lcore_id")
            .allowlist_function("rte_memzone_.*")
            .allowlist_function("rte_mempool_(create|create_empty|lookup|free|avail_count|in_use_count|obj_iter|populate_default|set_ops_byname|walk)")
            .allowlist_function("rte_ring_(create_elem|lookup|free|reset)")
            .allowlist_function("xio_shim_.*")
            .allowlist_var("RING_F_.*|RTE_MEMPOOL_F_.*|MEMPOOL_F_.*|RTE_MEMZONE_.*|SOCKET_ID_ANY|RTE_MEMPOOL_NAMESIZE|RTE_RING_NAMESIZE|RTE_MEMZONE_NAMESIZE")
            .allowlist_type("rte_proc_type_t|xio_shim_limits")
            .opaque_type("rte_mempool|rte_ring|rte_memzone")
            .derive_default(false)
            .layout_tests(false)
            .constified_enum_module("xio_shim_limits")
            .generate_comments(false)
            .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
            .generate()
            .expect("bindgen could not generate DPDK bindings");
        let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("bindings.rs");
        bindings.write_to_file(out).expect("writing bindings");
    }
}
