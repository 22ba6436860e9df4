//! The `observer` binary: parse arguments, set up logging, dispatch.

use std::process::ExitCode;

use anyhow::{Context as _, Result};
use clap::Parser as _;
use observer::{
    aggregate::{Config, DestinationRow},
    cli::{AnalyzeArgs, Cli, Command, PathCommand, PathFormat, StatusArgs},
    http, path, status,
};

fn main() -> ExitCode {
    match real_main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("observer: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `observer path ...`: exit 0 clean, 1 violations, 2 unusable input.
fn path_cmd(cmd: &PathCommand) -> ExitCode {
    match cmd {
        PathCommand::Defaults { kind } => match path::render_catalog(kind.as_deref()) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("observer: error: {e}");
                ExitCode::from(2)
            }
        },
        PathCommand::Check(args) => {
            let result = std::fs::read_to_string(&args.file)
                .map_err(|e| format!("reading {}: {e}", args.file.display()))
                .and_then(|src| path::parse(&src).map_err(|e| format!("{}: {e}", args.file.display())));
            let hops = match result {
                Ok(h) => h,
                Err(e) => {
                    eprintln!("observer: error: {e}");
                    return ExitCode::from(2);
                }
            };
            let mut report = path::check(&hops);
            if args.observed {
                let rows = http::get(&args.addr, "/api/v1/destinations")
                    .and_then(|b| serde_json::from_slice::<Vec<DestinationRow>>(&b).map_err(|e| e.to_string()));
                match rows {
                    Ok(rows) => path::compare_observed(&mut report, &rows),
                    Err(e) => {
                        eprintln!("observer: error: --observed: {e}");
                        return ExitCode::from(2);
                    }
                }
            }
            match args.format {
                PathFormat::Table => print!("{}", path::render(&report)),
                PathFormat::Json => match serde_json::to_string_pretty(&report) {
                    Ok(j) => println!("{j}"),
                    Err(e) => {
                        eprintln!("observer: error: {e}");
                        return ExitCode::from(2);
                    }
                },
            }
            if report.violations.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
    }
}

fn real_main() -> Result<ExitCode> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).format_target(false).init();
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(observer::daemon::run(args))?;
        }
        Command::Status(args) => status_cmd(&args)?,
        Command::Analyze(args) => analyze_cmd(&args)?,
        Command::Path(cmd) => return Ok(path_cmd(&cmd)),
    }
    Ok(ExitCode::SUCCESS)
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
