//! One shutdown path: SIGINT or SIGTERM cancels one token that every part of a service watches.

use tokio_util::sync::CancellationToken;

/// A token cancelled on the first SIGINT or SIGTERM. Must be called inside a tokio runtime.
pub fn on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown signal received");
        t.cancel();
    });
    token
}

#[cfg(unix)]
async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!(error = %e, "cannot listen for signals; only ctrl-c stops this process");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(not(unix))]
async fn wait_for_signal() {
    let _ = tokio::signal::ctrl_c().await;
}
