//! The listener: every path goes through [`super::proxy::handle`]; stopping drains first.

use std::future::Future;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::serve::ListenerExt as _;
use axum::Router;
use tokio::net::TcpListener;

use super::state::{DrainOutcome, Gateway};

/// The gateway's HTTP service.
pub fn router(gw: Arc<Gateway>) -> Router {
    Router::new().fallback(|State(gw): State<Arc<Gateway>>, req: Request| super::proxy::handle(gw, req)).with_state(gw)
}

/// Serve on `listener` until `stop` resolves, then drain: new requests get 503 while in-flight
/// ones finish (up to the drain timeout, after which their streams end with the error event),
/// then the listener closes.
pub async fn serve(
    listener: TcpListener,
    gw: Arc<Gateway>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<DrainOutcome> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let g = gw.clone();
    let shutdown = async move {
        stop.await;
        let outcome = g.drain().await;
        let _ = tx.send(outcome);
    };
    // TCP_NODELAY: a response's head and its first event go out at once, not 40 ms later
    // (Nagle against the client's delayed ACK).
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, router(gw)).with_graceful_shutdown(shutdown).await?;
    // The shutdown future ran to completion before the server returned.
    Ok(rx.await.unwrap_or(DrainOutcome::Idle))
}
