//! Against the real PyPI. Ignored by default (network); run with
//! `cargo test -p commstack-resolve --test live_pypi -- --ignored`.

use std::str::FromStr;
use std::time::Instant;

use commstack_pypi::{IndexClient, TargetPlatform};
use commstack_resolve::{Request, resolve};
use pep508_rs::Requirement;

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
#[ignore = "needs network access to pypi.org"]
async fn torch_2_11_closure() {
    let client = IndexClient::new("https://pypi.org/simple", None).unwrap();
    let req = Request {
        requirements: vec![Requirement::from_str("torch==2.11.0").unwrap()],
        target: TargetPlatform {
            python: (3, 12),
            arch: "x86_64".into(),
            glibc: (2, 39),
        },
        python_full: (3, 12, 3),
        exclude_newer: Some("2026-12-01T00:00:00Z".parse().unwrap()),
        overrides: vec![],
    };
    let t = Instant::now();
    let res = resolve(&client, &req).await.unwrap();
    eprintln!(
        "resolved {} packages in {:?}",
        res.packages.len(),
        t.elapsed()
    );
    for p in &res.packages {
        eprintln!("{}=={} {}", p.name, p.version, p.wheel.filename);
    }
    eprintln!("{:?}", client.stats);
    assert_eq!(
        res.get("nvidia-nccl-cu13").unwrap().version.to_string(),
        "2.28.9"
    );
}
