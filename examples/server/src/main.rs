//! `tessera-server`: Tessera over HTTP. See the package README.

fn main() -> std::process::ExitCode {
    tessera_server::main()
}
