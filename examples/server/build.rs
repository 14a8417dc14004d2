//! Marks the PostgreSQL tests ignored when no server is configured, so a
//! run without one shows them as ignored rather than passed.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(no_test_postgres)");
    println!("cargo::rerun-if-env-changed=TESSERA_TEST_POSTGRES_URL");
    if std::env::var_os("TESSERA_TEST_POSTGRES_URL").is_none() {
        println!("cargo::rustc-cfg=no_test_postgres");
    }
}
