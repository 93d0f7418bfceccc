// mimalloc rather than the system's allocator: a trace's records and each
// request's block table and path are allocated and freed by the tens of
// thousands: glibc's malloc and free were about 6 % of the 60 k-request
// trace's run (`perf report`), which takes 0.92 of the time with mimalloc
// (docs/performance.md). Version 2 without transparent huge pages keeps a
// run's peak RSS within 2 MB of glibc's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(pdsim::cli::main());
}
