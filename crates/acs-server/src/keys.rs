//! `acs keys`: create, list, top up and revoke API keys in the server's database.
//! Only a key's SHA-256 is stored; the secret is printed once, at creation.

use std::path::PathBuf;

use acs_core::ids::{KeyHash, new_api_key};
use acs_core::sql::MAX_SAFE_INTEGER;
use acs_core::{ApiError, ApiKey, Budget, ErrorCode, Store, Timestamp, ledger};
use clap::Subcommand;

use crate::cli::CliError;
use crate::db::Db;
use crate::random::random;

/// The keys subcommands.
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Make a key; prints its secret alone on the last line, once.
    Create {
        /// The server's data directory.
        #[arg(long, default_value = "acs-data")]
        data: PathBuf,
        /// The key's token Budget (at most 2^53 - 1, the largest count JSON clients
        /// read exactly).
        #[arg(long, value_parser = tokens_arg)]
        tokens: u64,
        /// How many requests of the key may run at once.
        #[arg(long, default_value_t = 8)]
        max_running: u32,
        /// Requests the key may start a minute (default: no limit).
        #[arg(long)]
        requests_per_minute: Option<u32>,
        /// Tokens the key's requests may hold a minute: each request's Hold counts
        /// into its minute, less what it gives back (default: no limit).
        #[arg(long, value_parser = tokens_arg)]
        tokens_per_minute: Option<u64>,
        /// A label.
        #[arg(long)]
        name: Option<String>,
    },
    /// List keys with their budgets.
    List {
        /// The server's data directory.
        #[arg(long, default_value = "acs-data")]
        data: PathBuf,
    },
    /// Add tokens to a key's Budget.
    TopUp {
        /// The server's data directory.
        #[arg(long, default_value = "acs-data")]
        data: PathBuf,
        /// The key's id (`key_…`, from `keys list`).
        id: String,
        /// Tokens to add (a Budget stops at 2^53 - 1).
        #[arg(long, value_parser = tokens_arg)]
        tokens: u64,
    },
    /// Revoke a key: it authenticates nothing from now on.
    Revoke {
        /// The server's data directory.
        #[arg(long, default_value = "acs-data")]
        data: PathBuf,
        /// The key's id.
        id: String,
    },
}

/// A token count from the command line: at most [`MAX_SAFE_INTEGER`], where Budgets
/// stop (larger counts would be cut there when stored).
fn tokens_arg(s: &str) -> Result<u64, String> {
    let n: u64 = s.parse().map_err(|e| format!("{e}"))?;
    if n > MAX_SAFE_INTEGER {
        return Err(format!("at most {MAX_SAFE_INTEGER} tokens"));
    }
    Ok(n)
}

/// A new key's traffic limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// How many of its requests may run at once.
    pub max_running: u32,
    /// Requests it may start a minute.
    pub requests_per_minute: Option<u32>,
    /// Tokens its requests may hold a minute.
    pub tokens_per_minute: Option<u64>,
}

/// Makes a key with a Budget and its limits; returns `(id, secret)`.
pub fn create(
    db: &Db,
    tokens: u64,
    limits: Limits,
    name: Option<String>,
    now: Timestamp,
) -> Result<(String, String), ApiError> {
    let secret = new_api_key(random());
    let id = format!("key_{}", hex_of(&random::<6>()));
    let key = ApiKey {
        id: id.clone(),
        hash: KeyHash::of(&secret),
        name,
        created_at: now,
        revoked: false,
    };
    db.tx(|s| {
        s.put_key(&key)?;
        s.put_budget(
            &id,
            &Budget {
                tokens_left: tokens.min(i64::MAX as u64),
                max_running: limits.max_running,
            },
        )?;
        if limits.requests_per_minute.is_some() || limits.tokens_per_minute.is_some() {
            ledger::set_rate_limits(s, &id, limits.requests_per_minute, limits.tokens_per_minute)?;
        }
        Ok(())
    })?;
    Ok((id, secret))
}

fn hex_of(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(ErrorCode::NotFound, format!("No key with id {id}."))
}

/// Runs a `keys` subcommand.
pub fn run(cmd: KeysCommand, now: Timestamp) -> Result<(), CliError> {
    let open =
        |d: &PathBuf| Db::open(d).map_err(|e| CliError::Api(ApiError::internal(e.to_string())));
    match cmd {
        KeysCommand::Create {
            data,
            tokens,
            max_running,
            requests_per_minute,
            tokens_per_minute,
            name,
        } => {
            let db = open(&data)?;
            let limits = Limits {
                max_running,
                requests_per_minute,
                tokens_per_minute,
            };
            let (id, secret) = create(&db, tokens, limits, name, now)?;
            eprintln!("created {id} with {tokens} tokens, {max_running} running at most");
            println!("{secret}");
        }
        KeysCommand::List { data } => {
            let db = open(&data)?;
            let rows = db.tx(|s| {
                let mut out = Vec::new();
                for k in s.keys()? {
                    let v = ledger::view(s, &k.id)?;
                    out.push((k, v));
                }
                Ok(out)
            })?;
            println!("id\tname\ttokens_left\ttokens_held\tmax_running\trevoked\tcreated_at");
            for (k, v) in rows {
                println!(
                    "{}\t{}\t{}\t{}\t{}\t{}\t{}",
                    k.id,
                    k.name.unwrap_or_default(),
                    v.tokens_left,
                    v.tokens_held,
                    v.max_running,
                    k.revoked,
                    k.created_at
                );
            }
        }
        KeysCommand::TopUp { data, id, tokens } => {
            let db = open(&data)?;
            let b = db.tx(|s| {
                s.key(&id)?.ok_or_else(|| not_found(&id))?;
                ledger::top_up(s, &id, tokens)
            })?;
            println!("{id}: {} tokens left", b.tokens_left);
        }
        KeysCommand::Revoke { data, id } => {
            let db = open(&data)?;
            db.tx(|s| {
                let mut k = s.key(&id)?.ok_or_else(|| not_found(&id))?;
                k.revoked = true;
                s.put_key(&k)?;
                Ok(())
            })?;
            println!("{id}: revoked");
        }
    }
    Ok(())
}
