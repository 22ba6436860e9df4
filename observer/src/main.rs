//! The `observer` binary: parse arguments, set up logging, dispatch.

use anyhow::Result;
use clap::Parser as _;
use observer::cli::{Cli, Command};

fn main() -> Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).format_target(false).init();
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(observer::daemon::run(args))
        }
    }
}
