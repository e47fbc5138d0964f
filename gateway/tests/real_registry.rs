//! Against a real registry: Debian's `docker-registry` (CNCF distribution),
//! started on a free loopback port with a temporary storage directory.
//! Images and an index are pushed through the OCI push API (blob upload +
//! manifest PUT), then queried through the gateway: what comes back must be
//! what was pushed.
mod common;

use common::push::push;
use common::*;
use fanout_budget::Config;
use fanout_gateway::embedded::{Image, Store};
use serde_json::json;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Registry {
    child: Child,
    url: String,
    _dir: TempDir,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn start_registry(binary: &std::path::Path) -> Registry {
    let dir = std::env::temp_dir().join(format!(
        "fanout-registry-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(dir.join("data")).unwrap();
    let port = free_port();
    let config = format!(
        "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
        dir.join("data").display()
    );
    std::fs::write(dir.join("config.yml"), config).unwrap();
    let child = Command::new(binary)
        .arg("serve")
        .arg(dir.join("config.yml"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("docker-registry starts");
    let registry = Registry {
        child,
        url: format!("http://127.0.0.1:{port}"),
        _dir: TempDir(dir),
    };
    let client = reqwest::Client::new();
    for _ in 0..200 {
        if let Ok(r) = client.get(format!("{}/v2/", registry.url)).send().await {
            if r.status().is_success() {
                return registry;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("docker-registry did not become ready on {}", registry.url);
}

#[tokio::test]
async fn pushed_images_and_index_come_back_through_the_gateway() {
    let Some(binary) = require_binary("docker-registry", "docker-registry") else {
        return;
    };
    let registry = start_registry(&binary).await;

    let mut store = Store::default();
    let amd = Image {
        created: "2025-05-05T05:05:05Z".into(),
        ..Image::demo("linux", "amd64", "real")
    };
    let arm = Image {
        variant: Some("v8".into()),
        ..Image::demo("linux", "arm64", "real")
    };
    store.put_image("team/app", Some("v1"), &amd);
    store.put_image("team/app", Some("v2"), &arm);
    store.put_index("team/app", "multi", &[amd.clone(), arm.clone()]);
    store.put_image("solo", Some("latest"), &amd);
    push(&registry.url, &store).await;

    let gateway =
        fanout_gateway::app::build(Config::default(), registry.url.parse().unwrap(), None);
    let query = r#"{
      repositories(first: 10) { nodes { name } pageInfo { hasNextPage } }
      repository(name: "team/app") {
        tags(first: 10) { totalCount nodes { name manifest {
          digest mediaType
          layers { digest mediaType size }
          manifests { digest mediaType size platform { os architecture variant } }
          config { os architecture created }
        } } }
      }
      missing: repository(name: "team/none") { name }
    }"#;
    let (status, body) = post(&gateway.router, json!({ "query": query }).to_string(), &[]).await;
    assert_eq!(status, 200);
    assert!(body.get("errors").is_none(), "{body}");
    assert_eq!(
        body["data"]["repositories"]["nodes"],
        json!([{"name": "solo"}, {"name": "team/app"}])
    );
    assert!(body["data"]["missing"].is_null());

    let repo = &store.repos["team/app"];
    let tags = body["data"]["repository"]["tags"]["nodes"]
        .as_array()
        .unwrap();
    assert_eq!(body["data"]["repository"]["tags"]["totalCount"], 3);
    for tag in tags {
        let name = tag["name"].as_str().unwrap();
        let manifest = &tag["manifest"];
        let digest = &repo.tags[name];
        assert_eq!(manifest["digest"], json!(digest), "tag {name}");
        let pushed: serde_json::Value =
            serde_json::from_slice(&repo.manifests[digest].body).unwrap();
        assert_eq!(manifest["mediaType"], pushed["mediaType"]);
        if name == "multi" {
            assert!(manifest["config"].is_null());
            assert_eq!(manifest["layers"], json!([]));
            let entries = pushed["manifests"].as_array().unwrap();
            assert_eq!(
                manifest["manifests"].as_array().unwrap().len(),
                entries.len()
            );
            for (got, want) in manifest["manifests"]
                .as_array()
                .unwrap()
                .iter()
                .zip(entries)
            {
                assert_eq!(got["digest"], want["digest"]);
                assert_eq!(got["size"], want["size"]);
                assert_eq!(
                    got["platform"]["architecture"],
                    want["platform"]["architecture"]
                );
            }
            assert_eq!(manifest["manifests"][1]["platform"]["variant"], "v8");
        } else {
            let layers = pushed["layers"].as_array().unwrap();
            assert_eq!(manifest["layers"].as_array().unwrap().len(), layers.len());
            for (got, want) in manifest["layers"].as_array().unwrap().iter().zip(layers) {
                assert_eq!(got["digest"], want["digest"]);
                assert_eq!(got["size"], want["size"]);
                assert_eq!(got["mediaType"], want["mediaType"]);
            }
            let image = if name == "v1" { &amd } else { &arm };
            assert_eq!(
                manifest["config"],
                json!({ "os": image.os, "architecture": image.architecture, "created": image.created })
            );
        }
    }
}
