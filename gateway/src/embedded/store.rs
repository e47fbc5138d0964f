//! What the embedded registry holds: repositories, tags, manifests, blobs —
//! content-addressed, with real SHA-256 digests, built the way a client pushes.

use serde_json::json;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};

/// OCI image manifest media type.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// OCI image index media type.
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// OCI image config media type.
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// OCI gzip layer media type.
pub const OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// `sha256:<hex>` of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    let mut out = String::with_capacity(71);
    out.push_str("sha256:");
    for b in hash {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// A stored manifest: its media type and exact bytes.
#[derive(Clone, Debug)]
pub struct StoredManifest {
    /// The manifest's media type (the `Content-Type` it is served with).
    pub media_type: String,
    /// The exact bytes (their digest is the manifest's digest).
    pub body: Vec<u8>,
}

/// One repository.
#[derive(Clone, Debug, Default)]
pub struct Repo {
    /// Tag → manifest digest.
    pub tags: BTreeMap<String, String>,
    /// Digest → manifest.
    pub manifests: HashMap<String, StoredManifest>,
    /// Digest → blob bytes.
    pub blobs: HashMap<String, Vec<u8>>,
}

/// An image to store: platform, config fields, layer contents.
#[derive(Clone, Debug)]
pub struct Image {
    /// `os` of the config.
    pub os: String,
    /// `architecture` of the config.
    pub architecture: String,
    /// `variant` (for the index's platform), if any.
    pub variant: Option<String>,
    /// `created` of the config.
    pub created: String,
    /// Layer blobs.
    pub layers: Vec<Vec<u8>>,
}

impl Image {
    /// A small image for `os/architecture` whose layers are derived from `seed`.
    pub fn demo(os: &str, architecture: &str, seed: &str) -> Self {
        let layers = (0..2)
            .map(|i| {
                format!("layer {i} of {seed} for {os}/{architecture}")
                    .repeat(3 + i)
                    .into_bytes()
            })
            .collect();
        Self {
            os: os.into(),
            architecture: architecture.into(),
            variant: None,
            created: "2026-01-01T00:00:00Z".into(),
            layers,
        }
    }
}

impl Image {
    /// A small image with `layers` tiny layers (a manifest listing many
    /// descriptors).
    pub fn with_layers(layers: usize) -> Self {
        Self {
            layers: (0..layers)
                .map(|i| format!("layer {i}").into_bytes())
                .collect(),
            ..Image::demo("linux", "amd64", "wide")
        }
    }
}

/// Every repository, in name order (the catalog order).
#[derive(Clone, Debug, Default)]
pub struct Store {
    /// Name → repository.
    pub repos: BTreeMap<String, Repo>,
}

impl Store {
    fn repo(&mut self, name: &str) -> &mut Repo {
        self.repos.entry(name.to_string()).or_default()
    }

    /// Stores a blob; its digest.
    pub fn put_blob(&mut self, name: &str, bytes: Vec<u8>) -> String {
        let d = digest(&bytes);
        self.repo(name).blobs.insert(d.clone(), bytes);
        d
    }

    /// Stores a manifest and, if `tag` is given, points the tag at it; its digest.
    pub fn put_manifest(
        &mut self,
        name: &str,
        tag: Option<&str>,
        media_type: &str,
        body: Vec<u8>,
    ) -> String {
        let d = digest(&body);
        let repo = self.repo(name);
        repo.manifests.insert(
            d.clone(),
            StoredManifest {
                media_type: media_type.into(),
                body,
            },
        );
        if let Some(tag) = tag {
            repo.tags.insert(tag.into(), d.clone());
        }
        d
    }

    /// Stores an image (config, layers, manifest) under `tag`; the manifest's
    /// digest and size.
    pub fn put_image(&mut self, name: &str, tag: Option<&str>, image: &Image) -> (String, usize) {
        let config = json!({
            "created": image.created,
            "architecture": image.architecture,
            "os": image.os,
            "config": {},
            "rootfs": { "type": "layers", "diff_ids": [] },
        })
        .to_string()
        .into_bytes();
        let config_size = config.len();
        let config_digest = self.put_blob(name, config);
        let layers: Vec<_> = image
            .layers
            .iter()
            .map(|layer| {
                let size = layer.len();
                let d = self.put_blob(name, layer.clone());
                json!({ "mediaType": OCI_LAYER, "digest": d, "size": size })
            })
            .collect();
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": { "mediaType": OCI_CONFIG, "digest": config_digest, "size": config_size },
            "layers": layers,
        })
        .to_string()
        .into_bytes();
        let size = manifest.len();
        (self.put_manifest(name, tag, OCI_MANIFEST, manifest), size)
    }

    /// Stores a multi-platform index of `images` under `tag`; its digest.
    pub fn put_index(&mut self, name: &str, tag: &str, images: &[Image]) -> String {
        let manifests: Vec<_> = images
            .iter()
            .map(|image| {
                let (d, size) = self.put_image(name, None, image);
                let mut platform = json!({ "os": image.os, "architecture": image.architecture });
                if let Some(variant) = &image.variant {
                    platform["variant"] = json!(variant);
                }
                json!({ "mediaType": OCI_MANIFEST, "digest": d, "size": size, "platform": platform })
            })
            .collect();
        let index = json!({ "schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests })
            .to_string()
            .into_bytes();
        self.put_manifest(name, Some(tag), OCI_INDEX, index)
    }

    /// The known data the gateway's tests and benchmarks read: `acme/app`
    /// with tags t00..t59 (single images), `acme/multi` with an index tag
    /// (`latest`) and a single one, `org/team/deep` (a namespaced name), and
    /// 30 filler repositories (`filler/r00`..`filler/r29`, tag `latest`).
    pub fn fixture() -> Self {
        let mut store = Store::default();
        for i in 0..60 {
            let tag = format!("t{i:02}");
            store.put_image("acme/app", Some(&tag), &Image::demo("linux", "amd64", &tag));
        }
        let images = [
            Image::demo("linux", "amd64", "m"),
            Image {
                variant: Some("v8".into()),
                ..Image::demo("linux", "arm64", "m")
            },
        ];
        store.put_index("acme/multi", "latest", &images);
        store.put_image(
            "acme/multi",
            Some("single"),
            &Image::demo("linux", "amd64", "single"),
        );
        store.put_image(
            "org/team/deep",
            Some("v1"),
            &Image::demo("linux", "arm64", "deep"),
        );
        for i in 0..30 {
            store.put_image(
                &format!("filler/r{i:02}"),
                Some("latest"),
                &Image::demo("linux", "amd64", "f"),
            );
        }
        store
    }

    /// The demo data `cargo run` serves: dozens of repositories, single images
    /// with config blobs, multi-arch indexes and namespaced names.
    pub fn demo() -> Self {
        let mut store = Store::default();
        let arches = [
            ("linux", "amd64", None),
            ("linux", "arm64", Some("v8")),
            ("linux", "arm", Some("v7")),
        ];
        for name in [
            "library/alpine",
            "library/busybox",
            "library/debian",
            "library/nginx",
            "library/redis",
        ] {
            for (i, tag) in ["1.0", "1.1", "2.0", "latest"].iter().enumerate() {
                if i % 2 == 0 {
                    store.put_image(
                        name,
                        Some(tag),
                        &Image::demo("linux", "amd64", &format!("{name}:{tag}")),
                    );
                } else {
                    let images: Vec<Image> = arches
                        .iter()
                        .map(|(os, arch, variant)| Image {
                            variant: variant.map(String::from),
                            ..Image::demo(os, arch, &format!("{name}:{tag}"))
                        })
                        .collect();
                    store.put_index(name, tag, &images);
                }
            }
        }
        for team in ["payments", "search", "platform"] {
            for app in 0..8 {
                let name = format!("{team}/service-{app}");
                for v in 0..(3 + app % 4) {
                    let tag = format!("v{v}.{app}");
                    store.put_image(
                        &name,
                        Some(&tag),
                        &Image::demo("linux", "amd64", &format!("{name}:{tag}")),
                    );
                }
            }
        }
        let deep = "org/team/tools/builder";
        for tag in ["stable", "edge"] {
            store.put_image(
                deep,
                Some(tag),
                &Image::demo("linux", "amd64", &format!("{deep}:{tag}")),
            );
        }
        store
    }
}
