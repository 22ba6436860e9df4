//! `observer path defaults` and `observer path check`: the command bodies.

use std::process::ExitCode;

use crate::{
    cli::{Output, PathCommand},
    diagnosis::aggregate::DestinationRow,
    surfaces::http,
};

/// `observer path ...`: exit 0 clean, 1 violations, 2 unusable input.
#[must_use]
pub fn command(cmd: &PathCommand) -> ExitCode {
    match cmd {
        PathCommand::Defaults { kind } => match crate::path::render_catalog(kind.as_deref()) {
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
            let hops = match crate::path::load(&args.file) {
                Ok(h) => h,
                Err(e) => {
                    eprintln!("observer: error: {e}");
                    return ExitCode::from(2);
                }
            };
            let mut report = crate::path::check(&hops);
            if args.observed {
                let rows = http::get(&args.addr, "/api/v1/destinations")
                    .and_then(|b| serde_json::from_slice::<Vec<DestinationRow>>(&b).map_err(|e| e.to_string()));
                match rows {
                    Ok(rows) => {
                        crate::path::compare_observed(
                            &mut report,
                            &rows,
                            args.netns,
                            crate::kernel::owner::host_netns(),
                        );
                    }
                    Err(e) => {
                        eprintln!("observer: error: --observed: {e}");
                        return ExitCode::from(2);
                    }
                }
            }
            match args.output {
                Output::Text => print!("{}", crate::path::render(&report)),
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
