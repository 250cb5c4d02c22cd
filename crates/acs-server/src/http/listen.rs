//! The accept loop: HTTP/1.1 connections with a deadline for the request head and a
//! cap on how many are open at once, so that clients that connect and send nothing
//! (or half a request line) cannot hold the server's sockets and tasks forever.
//!
//! A connection past the cap waits in the kernel's backlog until one closes. The
//! head's deadline also closes a kept-alive connection that stays idle that long,
//! as servers commonly do; clients reconnect.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// How long the accept loop waits before accepting again after an error (such as
/// running out of file descriptors), rather than spinning on it.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// How long open connections may take to finish after shutdown begins.
const DRAIN: Duration = Duration::from_secs(10);

/// The limits of [`serve`].
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest wait for a request's head (line and headers), from the connection's
    /// start or the end of its previous response.
    pub header_timeout: Duration,
    /// Most connections open at once.
    pub max_connections: usize,
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets the open
/// connections finish (up to [`DRAIN`]).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = Arc::clone(&permits).acquire_owned() => p.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Streams write an event at a time: with Nagle's algorithm on, an event
        // written while the last one waits for its ACK would wait too, and a client
        // that delays its ACKs (Linux by up to 40 ms) would see every event late.
        if let Err(e) = stream.set_nodelay(true) {
            tracing::warn!(error = %e, "could not set TCP_NODELAY");
        }
        let service = TowerToHyperService::new(app.clone());
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            // A client that goes away or times out ends its connection with an
            // error; there is nothing to answer it.
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the shutdown's drain time");
    }
}
