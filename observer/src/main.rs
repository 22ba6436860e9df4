//! The `observer` binary: parse arguments, set up logging, dispatch.

use std::process::ExitCode;

use anyhow::{Context as _, Result};
use clap::Parser as _;
use observer::{
    aggregate::{Config, DestinationRow},
    cli::{
        AnalyzeArgs, Cli, Command, DebugCommand, LogFormat, Output, PathCommand, ReportArgs, ReportFormat, StatusArgs,
    },
    event::clock_ns,
    http, path, report, status,
    store::{Record, Store},
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
                    Ok(rows) => {
                        path::compare_observed(&mut report, &rows, args.netns, observer::owner::host_netns());
                    }
                    Err(e) => {
                        eprintln!("observer: error: --observed: {e}");
                        return ExitCode::from(2);
                    }
                }
            }
            match args.output {
                Output::Text => print!("{}", path::render(&report)),
                Output::Json => match serde_json::to_string_pretty(&report) {
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
    init_logging(json_logs);
    match cli.command {
        Command::Run(args) if args.print_config => print!("{}", args.to_toml()),
        Command::Run(args) => {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(observer::daemon::run(args))?;
        }
        Command::Status(args) => status_cmd(&args)?,
        Command::Analyze(args) => analyze_cmd(&args)?,
        Command::Path(cmd) => return Ok(path_cmd(&cmd)),
        Command::Report(args) => report_cmd(&args)?,
        Command::Debug(DebugCommand::WriteEvidence { data_dir }) => debug_write_evidence(&data_dir)?,
        Command::Debug(DebugCommand::Docs { out_dir }) => write_docs(&out_dir)?,
        Command::Debug(DebugCommand::BenchPipeline { events, destinations }) => {
            println!("{}", serde_json::to_string(&observer::bench::pipeline(events, destinations))?);
        }
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
    print_rows(&rows, args.json())
}

fn analyze_cmd(args: &AnalyzeArgs) -> Result<()> {
    let file = std::fs::File::open(&args.file).with_context(|| format!("opening {}", args.file.display()))?;
    let events = status::read_recording(file).with_context(|| format!("in {}", args.file.display()))?;
    let window_ns = u64::try_from(args.window.as_nanos()).unwrap_or(u64::MAX);
    let rows = status::analyze(
        &events,
        Config { window_ns, max_destinations: args.max_destinations, host_netns: observer::owner::host_netns() },
    );
    print_rows(&rows, args.json())
}

fn report_cmd(args: &ReportArgs) -> Result<()> {
    let dest: std::net::SocketAddr = args
        .destination
        .parse()
        .with_context(|| format!("--destination `{}` is not ip:port (IPv6 as [addr]:port)", args.destination))?;
    let destination = dest.to_string();
    let now = clock_ns(libc::CLOCK_REALTIME);
    let since_ns = now.saturating_sub(u64::try_from(args.since.as_nanos()).unwrap_or(u64::MAX));
    let input = if let Some(rec) = &args.recording {
        let file = std::fs::File::open(rec).with_context(|| format!("opening {}", rec.display()))?;
        let events = status::read_recording(file).with_context(|| format!("in {}", rec.display()))?;
        let mut input =
            report::input_from_recording(events, dest, u64::try_from(args.since.as_nanos()).unwrap_or(u64::MAX));
        input.select = args.select.select();
        input
    } else {
        let store = Store::open(&args.data_dir).context("opening the evidence store")?;
        report::Input {
            events: store.events(Some(&destination), since_ns)?,
            volume: store.volume(&destination, since_ns)?,
            changes: store.changes(&destination, since_ns)?,
            destination,
            since_ns,
            until_ns: now,
            select: args.select.select(),
            host_netns: observer::owner::host_netns(),
        }
    };
    let r = report::build(&input)?;
    let text = match args.format {
        ReportFormat::Html => report::html(&r),
        ReportFormat::Md => report::markdown(&r),
        ReportFormat::Json => serde_json::to_string_pretty(&r)? + "\n",
    };
    match &args.output {
        Some(path) => {
            use std::{io::Write as _, os::unix::fs::OpenOptionsExt as _};
            // The report names peers and processes: private to its writer.
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(path)
                .and_then(|mut f| f.write_all(text.as_bytes()))
                .with_context(|| format!("writing {}", path.display()))?;
        }
        None => print!("{text}"),
    }
    Ok(())
}

/// Writes batches of synthetic evidence forever; tests kill it with SIGKILL.
fn debug_write_evidence(dir: &std::path::Path) -> Result<()> {
    let mut store = Store::open(dir)?;
    let mut k: u64 = 0;
    loop {
        let now = clock_ns(libc::CLOCK_REALTIME);
        let batch: Vec<Record> = (0..500)
            .map(|i| {
                k += 1;
                let mut e = observer::event::SockEvent::new(
                    now + i,
                    observer::event::EventKind::Reuse,
                    observer::event::Role::Client,
                    "10.0.0.1:40000".parse().expect("literal"),
                    "10.0.0.2:443".parse().expect("literal"),
                    #[allow(clippy::cast_precision_loss, reason = "synthetic idle ages")]
                    ((k % 120) as f64),
                );
                e.comm = "writer".into();
                e.outcome = Some(observer::event::Outcome::Ok);
                e.sock_id = k;
                Record::Event(e)
            })
            .collect();
        store.insert(&batch)?;
        println!("{k}");
    }
}
