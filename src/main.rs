fn main() {
    std::process::exit(rsi_master::cli::main());
}
