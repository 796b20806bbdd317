//! The listener: every path goes through [`super::proxy::handle`]; stopping drains first.
//!
//! Connections are served by hyper's HTTP/1 server directly (not `axum::serve`), for the limits
//! a front door needs against slow or oversized clients: a deadline for a request's head
//! (`header_timeout`, counted from the accept or from the end of the previous response, so an
//! idle keep-alive connection is closed by it too) and a cap on its size (`max_header_bytes`,
//! 431 above).

use std::future::Future;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::state::{DrainOutcome, Gateway};

/// The gateway's HTTP service.
pub fn router(gw: Arc<Gateway>) -> Router {
    Router::new().fallback(|State(gw): State<Arc<Gateway>>, req: Request| super::proxy::handle(gw, req)).with_state(gw)
}

/// Serve on `listener` until `stop` resolves, then drain: new requests get 503 while in-flight
/// ones finish (up to the drain timeout, after which their streams end with the error event),
/// then the listener closes and every connection is ended once its response is done.
pub async fn serve(
    listener: TcpListener,
    gw: Arc<Gateway>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<DrainOutcome> {
    let g = gw.clone();
    let drained = async move {
        stop.await;
        g.drain().await
    };
    tokio::pin!(drained);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(gw.cfg.header_timeout)
        .max_header_size(gw.cfg.max_header_bytes)
        .keep_alive(true);
    let app = router(gw);
    let (closing, _) = watch::channel(false);
    let outcome = loop {
        let tcp = tokio::select! {
            outcome = &mut drained => break outcome,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                // Out of file descriptors and the like: the next accept may work.
                Err(_) => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // TCP_NODELAY: a response's head and its first event go out at once, not 40 ms later
        // (Nagle against the client's delayed ACK).
        let _ = tcp.set_nodelay(true);
        let conn = http.serve_connection(TokioIo::new(tcp), TowerToHyperService::new(app.clone()));
        let mut close = closing.subscribe();
        tokio::spawn(async move {
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                () = async { let _ = close.wait_for(|c| *c).await; } => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    };
    drop(listener);
    let _ = closing.send(true);
    // Every connection task holds a receiver until its connection has ended.
    closing.closed().await;
    Ok(outcome)
}
