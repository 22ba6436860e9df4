//! The `observer` binary: parse arguments, set up logging, dispatch.

use std::process::ExitCode;

use anyhow::{Context as _, Result};
use clap::Parser as _;
use observer::{
    cli::{Cli, Command, DebugCommand, LogFormat},
    commands::{path, probe, report, status},
    surfaces::store,
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

/// Shell completions and man pages from the clap definitions.
fn write_docs(out_dir: &std::path::Path) -> Result<()> {
    use clap::CommandFactory as _;
    let (completions, man) = (out_dir.join("completions"), out_dir.join("man"));
    for d in [&completions, &man] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    for shell in [clap_complete::Shell::Bash, clap_complete::Shell::Zsh, clap_complete::Shell::Fish] {
        clap_complete::generate_to(shell, &mut Cli::command(), "observer", &completions)
            .with_context(|| format!("writing {shell} completions"))?;
    }
    clap_mangen::generate_to(Cli::command(), &man).context("writing the man pages")?;
    Ok(())
}

/// Logs go to standard error: text lines, or one JSON object per line
/// (`{"ts", "level", "message"}`) with `--log-format json`.
fn init_logging(json: bool) {
    let mut b = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    b.format_target(false);
    if json {
        b.format(|buf, record| {
            use std::io::Write as _;
            let line = serde_json::json!({
                "ts": buf.timestamp_millis().to_string(),
                "level": record.level().as_str(),
                "message": record.args().to_string(),
            });
            writeln!(buf, "{line}")
        });
    }
    b.init();
}

fn real_main() -> Result<ExitCode> {
    let cli = Cli::parse_from(observer::config::expand(std::env::args_os().collect())?);
    let json_logs = matches!(&cli.command, Command::Run(a) if a.log_format == LogFormat::Json);
    if !matches!(&cli.command, Command::Run(a) if !a.print_config) {
        // A command whose reader went away (`observer status | head -1`)
        // ends quietly, as Unix tools do. The daemon keeps SIGPIPE ignored:
        // it sees EPIPE and stops with its evidence stored.
        // SAFETY: restoring a signal's default action before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    init_logging(json_logs);
    match cli.command {
        Command::Run(args) if args.print_config => print!("{}", args.to_toml()),
        Command::Run(args) => {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(observer::daemon::run(*args))?;
        }
        Command::Status(args) => status::status_command(&args)?,
        Command::Analyze(args) => status::analyze_command(&args)?,
        Command::Path(cmd) => return Ok(path::command(&cmd)),
        Command::Report(args) => report::command(&args)?,
        Command::Probe(args) => return Ok(probe::command(&args)),
        Command::Debug(DebugCommand::WriteEvidence { data_dir, records, destinations }) => {
            store::debug_write_evidence(&data_dir, records, destinations)?;
        }
        Command::Debug(DebugCommand::Docs { out_dir }) => write_docs(&out_dir)?,
        Command::Debug(DebugCommand::EvidenceKeys { recording, data_dir }) => {
            store::debug_evidence_keys(recording.as_deref(), data_dir.as_deref())?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
