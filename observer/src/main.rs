//! The `observer` binary: parse arguments, set up logging, dispatch.

use std::process::ExitCode;

use anyhow::{Context as _, Result};
use clap::Parser as _;
use observer::{
    aggregate::{Config, DestinationRow},
    cli::{AnalyzeArgs, Cli, Command, StatusArgs},
    http, status,
};

fn main() -> ExitCode {
    match real_main() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("observer: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn real_main() -> Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).format_target(false).init();
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(observer::daemon::run(args))
        }
        Command::Status(args) => status_cmd(&args),
        Command::Analyze(args) => analyze_cmd(&args),
    }
}

fn print_rows(rows: &[DestinationRow], json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(rows)?);
    } else {
        print!("{}", status::render_table(rows));
    }
    Ok(())
}

fn status_cmd(args: &StatusArgs) -> Result<()> {
    let body = http::get(&args.addr, "/api/v1/destinations").map_err(anyhow::Error::msg)?;
    let rows: Vec<DestinationRow> = serde_json::from_slice(&body).context("the daemon's table is not valid JSON")?;
    print_rows(&rows, args.json)
}

fn analyze_cmd(args: &AnalyzeArgs) -> Result<()> {
    let file = std::fs::File::open(&args.file).with_context(|| format!("opening {}", args.file.display()))?;
    let events = status::read_recording(file).with_context(|| format!("in {}", args.file.display()))?;
    let window_ns = u64::try_from(args.window.as_nanos()).unwrap_or(u64::MAX);
    let rows = status::analyze(&events, Config { window_ns, max_destinations: args.max_destinations });
    print_rows(&rows, args.json)
}
