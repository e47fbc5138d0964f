//! A client that disconnects mid-request cancels its reads: the upstream
//! sees the connection close and every slot is freed.
use fanout_budget::config::HostConfig;
use fanout_budget::Config;
use fanout_gateway::embedded::{EmbeddedRegistry, Fault};
use std::net::SocketAddr;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_disconnect_cancels_its_reads_over_real_tcp() {
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    for i in 0..4 {
        registry.set_tag_fault("acme/app", &format!("t{i:02}"), Some(Fault::Hang));
    }
    let mut config = Config::default();
    config.hosts.insert(
        registry.host(),
        HostConfig::default()
            .max_concurrent(8)
            .acquire_wait_ms(1000),
    );
    let gateway = fanout_gateway::app::build(config, registry.url().parse().unwrap(), None);
    let engine = gateway.engine.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            gateway
                .router
                .into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });

    let client = tokio::spawn(async move {
        reqwest::Client::new()
            .post(format!("http://{addr}/graphql"))
            .json(&serde_json::json!({ "query": r#"{ repository(name: "acme/app") { tags(first: 4) { nodes { manifest { digest } } } } }"# }))
            .send()
            .await
    });
    let mut hung = false;
    for _ in 0..400 {
        if registry.counters().in_flight() == 4 {
            hung = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(hung, "the four hung reads never reached the upstream");
    assert_eq!(engine.hosts().in_flight(&registry.host()), 4);

    client.abort(); // the client goes away; its connection closes
    let _ = client.await;
    let mut released = false;
    for _ in 0..300 {
        if registry.counters().in_flight() == 0 && engine.hosts().in_flight(&registry.host()) == 0 {
            released = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        released,
        "after the disconnect: upstream in flight {}, engine in flight {}",
        registry.counters().in_flight(),
        engine.hosts().in_flight(&registry.host())
    );
    server.abort();
}
