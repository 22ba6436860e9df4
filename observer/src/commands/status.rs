//! `observer status` and `observer analyze`: the command bodies.

use anyhow::{Context as _, Result};

use crate::{
    cli::{AnalyzeArgs, AnalyzeOutput, StatusArgs},
    diagnosis::aggregate::{Config, DestinationRow},
    surfaces::http,
};

fn print_rows(rows: &[DestinationRow], json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(rows)?);
    } else {
        print!("{}", crate::surfaces::status::render_table(rows));
    }
    Ok(())
}

pub fn status_command(args: &StatusArgs) -> Result<()> {
    let body = http::get(&args.addr, "/api/v1/destinations").map_err(anyhow::Error::msg)?;
    let rows: Vec<DestinationRow> = serde_json::from_slice(&body).context("the daemon's table is not valid JSON")?;
    print_rows(&rows, args.json())
}

pub fn analyze_command(args: &AnalyzeArgs) -> Result<()> {
    let file = std::fs::File::open(&args.file).with_context(|| format!("opening {}", args.file.display()))?;
    let events =
        crate::surfaces::status::read_recording(file).with_context(|| format!("in {}", args.file.display()))?;
    let window_ns = u64::try_from(args.window.as_nanos()).unwrap_or(u64::MAX);
    let config =
        Config { window_ns, max_destinations: args.max_destinations, host_netns: crate::kernel::owner::host_netns() };
    if args.output == AnalyzeOutput::Prometheus {
        print!("{}", crate::surfaces::metrics::exposition_of(&events, config, args.metrics_histograms));
        return Ok(());
    }
    let rows = crate::surfaces::status::analyze(&events, config);
    print_rows(&rows, args.json())
}
