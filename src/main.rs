//! The `sluice` binary: `sluice serve` and `sluice check-config` (SPEC section 9).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sluice::config::Config;
use sluice::server::Server;

/// jemalloc, configured in `.cargo/config.toml`: memory freed after a burst of large requests
/// goes back to the system (docs/runtime.md has the measurements against glibc's malloc).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "A gateway between AI agents and LLM provider APIs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Serve {
        /// TOML config file; without one, built-in defaults apply.
        #[arg(long, env = "SLUICE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Print the effective configuration (secrets redacted), or the key that is wrong.
    CheckConfig {
        #[arg(long, env = "SLUICE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Replay recorded requests (one JSON object per line: path, session, headers, body)
    /// through sluice with a throwaway store, each as if its response succeeded, and print
    /// what sluice saved per turn and in total.
    Replay {
        #[arg(long, env = "SLUICE_CONFIG")]
        config: Option<PathBuf>,
        /// The recorded requests.
        trace: PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { config } => match Config::load(config.as_deref()) {
            Ok(config) => {
                print!("{}", config.redacted_toml());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("sluice: invalid configuration: {e}");
                ExitCode::from(2)
            }
        },
        Command::Replay {
            config,
            trace,
            json,
        } => replay(config, &trace, json),
        Command::Serve { config } => {
            init_logging();
            let config = match Config::load(config.as_deref()) {
                Ok(config) => config,
                Err(e) => {
                    tracing::error!(key = %e.key, "invalid configuration: {e}");
                    return ExitCode::from(2);
                }
            };
            let runtime = match runtime() {
                Ok(runtime) => runtime,
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the runtime");
                    return ExitCode::FAILURE;
                }
            };
            runtime.block_on(serve(config))
        }
    }
}

/// `sluice replay`: the report on stdout, a progress bar on a terminal's stderr.
fn replay(config: Option<PathBuf>, trace: &std::path::Path, json: bool) -> ExitCode {
    let config = match Config::load(config.as_deref()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("sluice: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("sluice: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(sluice::replay::run(config, trace, !json)) {
        Ok(report) if json => match serde_json::to_string_pretty(&report) {
            Ok(text) => {
                println!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("sluice: {e}");
                ExitCode::FAILURE
            }
        },
        Ok(report) => {
            print!("{}", sluice::replay::render(&report));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sluice replay: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The runtime `serve` and `replay` run on (the proxy's workers have their own).
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

async fn serve(config: Config) -> ExitCode {
    let server = match Server::bind(config).await {
        Ok(server) => server,
        Err(e) => {
            tracing::error!("cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    match (server.proxy_addr(), server.admin_addr()) {
        (Ok(proxy), Ok(admin)) => {
            tracing::info!(proxy = %proxy, admin = %admin, version = env!("CARGO_PKG_VERSION"), "listening");
        }
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!(error = %e, "cannot read the bound addresses");
            return ExitCode::FAILURE;
        }
    }
    server.run(shutdown_signal()).await;
    ExitCode::SUCCESS
}

/// Resolves on SIGTERM or SIGINT (O4).
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {},
                    _ = term.recv() => {},
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; only SIGINT stops sluice");
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// Logs to stdout: human-readable, or JSON lines with `SLUICE_LOG_FORMAT=json` (O5). The level
/// comes from `SLUICE_LOG` (e.g. `info`, `sluice=debug`), default `info`.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let json = std::env::var("SLUICE_LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("json"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    if json {
        builder.json().flatten_event(true).init();
    } else {
        builder.init();
    }
}
