//! Marks the tests that need what this machine lacks as ignored, so a run
//! without it shows them as ignored rather than passed or failed:
//!
//! - `no_test_postgres`: `TESSERA_TEST_POSTGRES_URL` is unset;
//! - `no_chromium`: no `chromium` on the `PATH` (the board's browser test
//!   drives Debian's);
//! - `no_curl`: no `curl` on the `PATH` (the README's walkthrough runs it).

use std::path::Path;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(no_test_postgres)");
    println!("cargo::rerun-if-env-changed=TESSERA_TEST_POSTGRES_URL");
    if std::env::var_os("TESSERA_TEST_POSTGRES_URL").is_none() {
        println!("cargo::rustc-cfg=no_test_postgres");
    }
    println!("cargo::rustc-check-cfg=cfg(no_chromium)");
    println!("cargo::rerun-if-env-changed=PATH");
    let path = std::env::var_os("PATH").unwrap_or_default();
    println!("cargo::rustc-check-cfg=cfg(no_curl)");
    if !std::env::split_paths(&path).any(|dir| dir.join("curl").is_file()) {
        println!("cargo::rustc-cfg=no_curl");
    }
    let found = std::env::split_paths(&path).find(|dir| dir.join("chromium").is_file());
    match found {
        // Looked at again if it goes.
        Some(dir) => println!("cargo::rerun-if-changed={}", dir.join("chromium").display()),
        None => {
            // Looked at again once Debian's package puts it in place.
            println!(
                "cargo::rerun-if-changed={}",
                Path::new("/usr/bin/chromium").display()
            );
            println!("cargo::rustc-cfg=no_chromium");
        }
    }
}
