//! A GraphQL-over-WebSocket client for the tests: `graphql-transport-ws`
//! messages sent and received over a tokio-tungstenite socket, each wait
//! bounded.

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// How long one message may take to arrive.
pub const LIMIT: Duration = Duration::from_secs(30);

/// Sends one protocol message.
pub async fn send<S: AsyncRead + AsyncWrite + Unpin>(
    socket: &mut WebSocketStream<S>,
    message: Value,
) {
    socket
        .send(Message::text(message.to_string()))
        .await
        .unwrap();
}

/// The next protocol message (pings and `ka` skipped), within [`LIMIT`]
/// however many pings come first; `Err` with the close code when the
/// server closed (`None`: no close frame).
pub async fn receive<S: AsyncRead + AsyncWrite + Unpin>(
    socket: &mut WebSocketStream<S>,
) -> Result<Value, Option<u16>> {
    let until = tokio::time::Instant::now() + LIMIT;
    loop {
        let frame = tokio::time::timeout_at(until, socket.next())
            .await
            .expect("a message within the limit");
        match frame {
            Some(Ok(Message::Text(text))) => {
                let value: Value = serde_json::from_str(&text).unwrap();
                if value["type"] == "ping" || value["type"] == "ka" {
                    continue;
                }
                return Ok(value);
            }
            Some(Ok(Message::Close(frame))) => return Err(frame.map(|f| u16::from(f.code))),
            Some(Ok(_)) => continue,
            Some(Err(_)) | None => return Err(None),
        }
    }
}

/// `connection_init` with `payload`, and its `connection_ack`.
pub async fn init<S: AsyncRead + AsyncWrite + Unpin>(
    socket: &mut WebSocketStream<S>,
    payload: Value,
) {
    send(
        socket,
        json!({ "type": "connection_init", "payload": payload }),
    )
    .await;
    assert_eq!(receive(socket).await.unwrap()["type"], "connection_ack");
}

/// `subscribe` to `query` as `id`.
pub async fn subscribe<S: AsyncRead + AsyncWrite + Unpin>(
    socket: &mut WebSocketStream<S>,
    id: &str,
    query: &str,
) {
    let message = json!({ "type": "subscribe", "id": id, "payload": { "query": query } });
    send(socket, message).await;
}

/// Every message of subscription `id` until its `complete` (others' kept out).
pub async fn until_complete<S: AsyncRead + AsyncWrite + Unpin>(
    socket: &mut WebSocketStream<S>,
    id: &str,
) -> Vec<Value> {
    let mut events = Vec::new();
    loop {
        let message = receive(socket).await.expect("no close");
        if message["id"] != id {
            continue;
        }
        if message["type"] == "complete" {
            return events;
        }
        events.push(message);
    }
}

/// A `graphql-transport-ws` connection to `ws://{addr}/graphql` from
/// loopback address `from` (the server keys its clients by it).
pub async fn connect_from(
    addr: SocketAddr,
    from: Ipv4Addr,
) -> Result<WebSocketStream<TcpStream>, String> {
    let socket = TcpSocket::new_v4().map_err(|e| e.to_string())?;
    socket
        .bind(SocketAddr::from((from, 0)))
        .map_err(|e| e.to_string())?;
    let stream = socket.connect(addr).await.map_err(|e| e.to_string())?;
    let mut request = format!("ws://{addr}/graphql")
        .into_client_request()
        .map_err(|e| e.to_string())?;
    request.headers_mut().insert(
        "sec-websocket-protocol",
        "graphql-transport-ws".parse().unwrap(),
    );
    let (socket, _) = tokio_tungstenite::client_async(request, stream)
        .await
        .map_err(|e| e.to_string())?;
    Ok(socket)
}
