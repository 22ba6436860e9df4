//! `observer run --config FILE`: every `run` flag from a TOML file.
//!
//! Precedence, highest first: a flag on the command line, an `OBSERVER_*`
//! environment variable (clap's `env`), the file, the default. The file's
//! keys are the flags' long names (`min-idle` or `min_idle`); values are
//! strings, numbers, booleans (for switches) or arrays (for repeatable
//! flags). The file is turned into flags inserted right after `run`, leaving
//! out every key a flag or an environment variable already sets, so clap
//! parses and validates everything in one place and its error messages name
//! the flag.

use std::{ffi::OsString, path::PathBuf};

use clap::CommandFactory as _;

use crate::cli::Cli;

/// What can be wrong with a configuration file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading the configuration file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("the configuration file {path} is not valid TOML: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("the configuration file {path} sets `{key}`, which is not a `run` setting; known: {known}")]
    UnknownKey { path: PathBuf, key: String, known: String },
    #[error("the configuration file {path} sets `{key}` to {found}; it takes {wants}")]
    BadValue { path: PathBuf, key: String, found: String, wants: &'static str },
}

/// The configuration file named by `--config` or `OBSERVER_CONFIG`.
fn config_path(args: &[OsString]) -> Option<PathBuf> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        if s == "--config" {
            return it.next().map(PathBuf::from);
        }
        if let Some(p) = s.strip_prefix("--config=") {
            return Some(PathBuf::from(p));
        }
    }
    std::env::var_os("OBSERVER_CONFIG").filter(|v| !v.is_empty()).map(PathBuf::from)
}

fn scalar(v: &toml::Value) -> Option<String> {
    match v {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        _ => None,
    }
}

/// `argv` with the configuration file's settings inserted as flags after
/// `run`; unchanged for other subcommands or without a file.
///
/// # Panics
///
/// Never: the `run` subcommand is part of [`Cli`].
pub fn expand(argv: Vec<OsString>) -> Result<Vec<OsString>, ConfigError> {
    if argv.get(1).is_none_or(|a| a != "run") {
        return Ok(argv);
    }
    let Some(path) = config_path(&argv[2..]) else { return Ok(argv) };
    let src = crate::files::read_text(&path, crate::files::MAX_TEXT_BYTES)
        .map_err(|source| ConfigError::Read { path: path.clone(), source })?;
    let table: toml::Table =
        src.parse().map_err(|e: toml::de::Error| ConfigError::Parse { path: path.clone(), message: e.to_string() })?;
    let cli = Cli::command();
    let run = cli.find_subcommand("run").expect("the run subcommand exists");
    let settings: Vec<&clap::Arg> =
        run.get_arguments().filter(|a| a.get_long().is_some_and(|l| l != "config" && !a.is_hide_set())).collect();
    let known = || settings.iter().filter_map(|a| a.get_long()).collect::<Vec<_>>().join(", ");
    let given = |long: &str| {
        argv[2..].iter().any(|a| {
            let s = a.to_string_lossy();
            s == format!("--{long}") || s.starts_with(&format!("--{long}="))
        })
    };
    let mut flags: Vec<OsString> = Vec::new();
    for (key, value) in &table {
        let long = key.replace('_', "-");
        let Some(arg) = settings.iter().find(|a| a.get_long() == Some(long.as_str())) else {
            return Err(ConfigError::UnknownKey { path, key: key.clone(), known: known() });
        };
        let from_env = arg.get_env().is_some_and(|e| std::env::var_os(e).is_some());
        if given(&long) || from_env {
            continue;
        }
        let bad =
            |wants| ConfigError::BadValue { path: path.clone(), key: key.clone(), found: value.to_string(), wants };
        let switch = !arg.get_action().takes_values();
        match value {
            toml::Value::Boolean(b) if switch => {
                if *b {
                    flags.push(format!("--{long}").into());
                }
            }
            _ if switch => return Err(bad("true or false")),
            toml::Value::Array(items) => {
                for item in items {
                    flags.push(format!("--{long}={}", scalar(item).ok_or_else(|| bad("an array of strings"))?).into());
                }
            }
            v => flags.push(format!("--{long}={}", scalar(v).ok_or_else(|| bad("a string or a number"))?).into()),
        }
    }
    let mut out = argv;
    out.splice(2..2, flags);
    Ok(out)
}

#[cfg(test)]
mod tests;
