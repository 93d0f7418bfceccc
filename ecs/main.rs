fn main() {
    std::process::exit(pdsim::cli::main());
}
