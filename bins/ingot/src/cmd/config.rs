//! `ingot config`: the config file's schema, a validity check, and the
//! effective settings with where each came from.

use std::path::PathBuf;

use clap::Subcommand;
use ingot_config::Layers;

use crate::cmd::serve::ServeArgs;
use crate::settings;

/// Config file tools.
#[derive(Subcommand, Debug)]
#[allow(clippy::large_enum_variant)] // parsed once at startup
pub enum ConfigCommand {
    /// Print the JSON schema of the config file.
    Schema,
    /// Check a config file on its own (no environment, no flags): prints
    /// "ok: FILE", or one error line and exits 1.
    Validate {
        /// The TOML file.
        file: PathBuf,
    },
    /// Print every setting `ingot serve` would use with these flags, and
    /// who set it (default, file:line, env VAR or flag).
    Show(ServeArgs),
}

/// Runs the command.
pub fn run(cmd: ConfigCommand) -> anyhow::Result<()> {
    match cmd {
        ConfigCommand::Schema => {
            println!("{}", serde_json::to_string_pretty(&ingot_config::schema())?);
        }
        ConfigCommand::Validate { file } => {
            settings::load_checked(&Layers {
                file: Some(file.clone()),
                ..Layers::default()
            })?;
            println!("ok: {}", file.display());
        }
        ConfigCommand::Show(args) => {
            let loaded = settings::load_checked(&args.layers()?)?;
            print!("{}", loaded.show());
        }
    }
    Ok(())
}
