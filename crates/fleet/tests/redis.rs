//! Against a real `redis-server` (Debian's package; scripts/test installs
//! it): each test starts its own on a free loopback port, without
//! persistence, and stops it. Skipped (with a line saying why) when the
//! binary is absent; failed instead under `CI=true` (ingot_testkit::require).
#![allow(clippy::unwrap_used)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ingot_fleet::{Fleet, FleetError, FleetSettings, Heartbeat, Instance, Role};

struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    fn start_on(port: u16) -> Option<Self> {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(Self { child, port })
    }

    fn start() -> Option<Self> {
        let installed = Command::new("redis-server")
            .arg("--version")
            .output()
            .is_ok();
        if !ingot_testkit::require(
            installed,
            "redis-server is not installed (scripts/test installs it)",
        ) {
            return None;
        }
        Self::start_on(free_port())
    }

    fn settings(&self, namespace: &str) -> FleetSettings {
        FleetSettings {
            url: format!("redis://127.0.0.1:{}", self.port),
            namespace: namespace.into(),
            connect_timeout: Duration::from_millis(300),
            command_timeout: Duration::from_millis(300),
            pool_size: 2,
            retry_after: Duration::from_millis(200),
        }
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[tokio::test]
async fn a_shared_bucket_bursts_its_limit_across_clients_then_refuses() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let a = Fleet::connect(&redis.settings("t")).unwrap();
    let b = Fleet::connect(&redis.settings("t")).unwrap();
    let mut allowed = 0;
    for i in 0..12 {
        let fleet = if i % 2 == 0 { &a } else { &b };
        let d = fleet.take_rate("k:requests:10", 10, 1).await.unwrap();
        if d.allowed {
            allowed += 1;
            assert_eq!(d.remaining, 10 - allowed, "after {allowed} taken");
        } else {
            assert_eq!(d.remaining, 0);
            // One unit comes back every 6 s.
            assert!(
                d.retry_after > Duration::from_millis(5800)
                    && d.retry_after <= Duration::from_secs(6),
                "{:?}",
                d.retry_after
            );
        }
    }
    assert_eq!(allowed, 10, "two clients share one bucket of 10");
    // Giving 3 back lets 3 more through, not a fourth.
    a.take_rate("k:requests:10", 10, -3).await.unwrap();
    for _ in 0..3 {
        assert!(b.take_rate("k:requests:10", 10, 1).await.unwrap().allowed);
    }
    assert!(!b.take_rate("k:requests:10", 10, 1).await.unwrap().allowed);
    // Another namespace is another bucket.
    let c = Fleet::connect(&redis.settings("other")).unwrap();
    assert!(c.take_rate("k:requests:10", 10, 1).await.unwrap().allowed);
}

#[tokio::test]
async fn a_bucket_refills_one_unit_per_interval_and_takes_many_at_once() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let f = Fleet::connect(&redis.settings("t")).unwrap();
    // 600 per minute: one unit per 100 ms.
    let d = f.take_rate("tok", 600, 600).await.unwrap();
    assert!(d.allowed && d.remaining == 0);
    assert!(d.reset > Duration::from_millis(59_000), "{:?}", d.reset);
    let d = f.take_rate("tok", 600, 5).await.unwrap();
    assert!(!d.allowed);
    assert!(
        d.retry_after > Duration::from_millis(400),
        "{:?}",
        d.retry_after
    );
    tokio::time::sleep(Duration::from_millis(550)).await;
    let d = f.take_rate("tok", 600, 5).await.unwrap();
    assert!(d.allowed, "5 units are back after 500 ms");
}

#[tokio::test]
async fn instances_expire_after_their_ttl_and_deregister_at_once() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let f = Fleet::connect(&redis.settings("t")).unwrap();
    let ttl = Duration::from_millis(600);
    let a = Instance::this_process(Role::Worker, "http://127.0.0.1:1".into(), vec!["m".into()]);
    let mut b = a.clone();
    b.id.push_str("-b");
    b.url = "http://127.0.0.1:2".into();
    f.heartbeat(&a, ttl).await.unwrap();
    let beat = Heartbeat::start(f.clone(), b.clone(), Duration::from_millis(100), ttl);
    tokio::time::sleep(Duration::from_millis(150)).await;
    let mut urls: Vec<String> = f
        .instances(Role::Worker)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.url)
        .collect();
    urls.sort();
    assert_eq!(urls, ["http://127.0.0.1:1", "http://127.0.0.1:2"]);
    assert!(f.instances(Role::Router).await.unwrap().is_empty());
    // `a` stops heartbeating (as if SIGKILLed): gone after its TTL; `b` stays.
    tokio::time::sleep(ttl).await;
    let live = f.instances(Role::Worker).await.unwrap();
    assert_eq!(live.len(), 1);
    assert_eq!(live[0], b);
    beat.stop().await;
    assert!(
        f.instances(Role::Worker).await.unwrap().is_empty(),
        "deregistered at once"
    );
}

#[tokio::test]
async fn an_outage_fails_fast_and_sharing_resumes_when_redis_returns() {
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    let port = redis.port;
    let f = Fleet::connect(&redis.settings("t")).unwrap();
    f.set_bytes("cache_set", "x", b"v".to_vec(), Duration::from_secs(60))
        .await
        .unwrap();
    redis.stop();
    let started = Instant::now();
    assert!(f.get_bytes("cache_get", "x").await.is_err());
    assert!(!f.is_up());
    // The breaker answers at once while open: no wait per request.
    let quick = Instant::now();
    for _ in 0..100 {
        assert!(matches!(
            f.get_bytes("cache_get", "x").await,
            Err(FleetError::Unavailable)
        ));
    }
    assert!(
        quick.elapsed() < Duration::from_millis(50),
        "{:?}",
        quick.elapsed()
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    let _back = RedisServer::start_on(port).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if f.set_bytes("cache_set", "y", b"w".to_vec(), Duration::from_secs(60))
            .await
            .is_ok()
        {
            break;
        }
        assert!(Instant::now() < deadline, "sharing did not resume");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(f.is_up());
    assert_eq!(
        f.get_bytes("cache_get", "y").await.unwrap(),
        Some(b"w".to_vec())
    );
}

#[tokio::test]
async fn a_server_that_never_answers_costs_one_timeout_then_nothing() {
    // A listener that accepts and never replies: a hung Redis.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let settings = FleetSettings {
        url: format!("redis://127.0.0.1:{port}"),
        namespace: "t".into(),
        connect_timeout: Duration::from_millis(100),
        command_timeout: Duration::from_millis(100),
        pool_size: 1,
        retry_after: Duration::from_secs(5),
    };
    let f = Fleet::connect(&settings).unwrap();
    let started = Instant::now();
    assert!(f.get_bytes("cache_get", "x").await.is_err());
    assert!(
        started.elapsed() < Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(
        f.get_bytes("cache_get", "x").await,
        Err(FleetError::Unavailable)
    ));
    drop(listener);
}
