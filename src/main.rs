fn main() {
    std::process::exit(rsi_master::faces::cli::main());
}
