//! Tells the chaos tests which servers this machine has, so a scenario
//! that needs one it lacks shows as ignored rather than passing unrun.

fn main() {
    println!("cargo::rerun-if-env-changed=TESSERA_TEST_POSTGRES_URL");
    println!("cargo::rerun-if-env-changed=TESSERA_TEST_POSTGRES_CLUSTER");
    println!("cargo::rustc-check-cfg=cfg(postgres_server)");
    println!("cargo::rustc-check-cfg=cfg(postgres_cluster)");
    let set = |name: &str| std::env::var_os(name).is_some_and(|value| !value.is_empty());
    if set("TESSERA_TEST_POSTGRES_URL") {
        println!("cargo::rustc-cfg=postgres_server");
        if set("TESSERA_TEST_POSTGRES_CLUSTER") {
            println!("cargo::rustc-cfg=postgres_cluster");
        }
    }
}
