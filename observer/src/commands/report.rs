//! `observer report`: the command body (read the store or a recording,
//! build, render, write privately).

use anyhow::{Context as _, Result};

use crate::{
    cli::{ReportArgs, ReportFormat},
    kernel::event::clock_ns,
    surfaces::store::Store,
};

pub fn command(args: &ReportArgs) -> Result<()> {
    let dest: std::net::SocketAddr = args
        .destination
        .parse()
        .with_context(|| format!("--destination `{}` is not ip:port (IPv6 as [addr]:port)", args.destination))?;
    let destination = dest.to_string();
    let now = clock_ns(libc::CLOCK_REALTIME);
    let since_ns = now.saturating_sub(u64::try_from(args.since.as_nanos()).unwrap_or(u64::MAX));
    // Every address the partner's name was reached at, for its card.
    let mut named_at: Vec<crate::kernel::event::SockEvent> = Vec::new();
    let input = if let Some(rec) = &args.recording {
        let file = std::fs::File::open(rec).with_context(|| format!("opening {}", rec.display()))?;
        let events = crate::surfaces::status::read_recording(file).with_context(|| format!("in {}", rec.display()))?;
        named_at.extend(events.iter().filter(|e| e.as_server_name().is_some()).cloned());
        let mut input = crate::surfaces::report::input_from_recording(
            events,
            dest,
            u64::try_from(args.since.as_nanos()).unwrap_or(u64::MAX),
        );
        input.select = args.select.select();
        input
    } else {
        let store = Store::open_read_only(&args.data_dir).context("opening the evidence store")?;
        store.each_event(None, since_ns, |e| {
            if e.as_server_name().is_some() {
                named_at.push(e);
            }
        })?;
        crate::surfaces::report::Input {
            events: store.events(Some(&destination), since_ns)?,
            volume: store.volume(&destination, since_ns)?,
            changes: store.changes(&destination, since_ns)?,
            probes: store.probes(&destination, since_ns)?,
            destination,
            since_ns,
            until_ns: now,
            select: args.select.select(),
            host_netns: crate::kernel::owner::host_netns(),
        }
    };
    let mut r = crate::surfaces::report::build(&input)?;
    crate::surfaces::report::add_name_addresses(&mut r, &named_at);
    let text = match args.format {
        ReportFormat::Html => crate::surfaces::report::html(&r),
        ReportFormat::Md => crate::surfaces::report::markdown(&r),
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
