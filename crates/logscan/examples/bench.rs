//! Measure logscan throughput on a synthetic log until `cargo xtask bench logscan` is wired:
//! `cargo run --release -p commstack-logscan --example bench -- [MB] [DIR]` (default 1024 MB in
//! the system temp dir). The log is deleted afterwards.

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let megabytes: u64 = args.next().map_or(Ok(1024), |s| s.parse())?;
    let dir = args.next().map_or_else(std::env::temp_dir, Into::into);
    let result = commstack_logscan::bench::run(&dir, megabytes * 1_000_000)?;
    println!("{}", result.summary());
    println!("(generated in {:.1} s)", result.generate_seconds);
    Ok(())
}
