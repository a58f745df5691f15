//! Experiments and canaries: the arm header, the arm's group and model.

use super::harness::{header_of, json_body, start, worker_of, FakeWorker, TestRouter};
use crate::proxy::ARM_HEADER;

/// Groups "a" and "b", one worker each, and `splits`.
async fn two_groups(a: &FakeWorker, b: &FakeWorker, splits: &str) -> TestRouter {
    let config = format!(
        "[[workers.groups]]\nname = \"a\"\nurls = [\"{}\"]\n\
         [[workers.groups]]\nname = \"b\"\nurls = [\"{}\"]\n{splits}",
        a.url, b.url
    );
    start(&config, &[a, b]).await
}

#[tokio::test(start_paused = true)]
async fn an_experiment_arm_is_named_in_the_header_and_sends_its_model() {
    let (a, b) = (FakeWorker::ok("exp-a"), FakeWorker::ok("exp-b"));
    let experiment = "[[experiments]]\nid = \"e1\"\nsplit_percent = 100\n\
        arms = [{name = \"control\", group = \"a\"}, {name = \"treat\", group = \"b\", model = \"m2\"}]\n";
    let r = two_groups(&a, &b, experiment).await;
    for _ in 0..3 {
        let resp = r.chat(false).await;
        assert_eq!(header_of(&resp, ARM_HEADER), Some("e1:treat"));
        assert_eq!(worker_of(&resp), b.url);
        assert_eq!(
            json_body(resp).await["model"],
            "m2",
            "the arm's model replaces the client's"
        );
    }
    assert_eq!(a.posts(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_rolled_back_canary_sends_everything_to_stable() {
    let (a, b) = (FakeWorker::ok("can-a"), FakeWorker::ok("can-b"));
    let canary = "[[canary]]\nname = \"c1\"\nstable_group = \"a\"\ncanary_group = \"b\"\n";
    let r = two_groups(&a, &b, canary).await;
    let rollback = r.post("/admin/canaries/c1/rollback", "").await;
    assert!(rollback.status().is_success(), "{:?}", rollback.status());
    for _ in 0..4 {
        let resp = r.chat(false).await;
        assert_eq!(header_of(&resp, ARM_HEADER), Some("canary:c1:stable"));
        assert_eq!(worker_of(&resp), a.url);
    }
    assert_eq!(b.posts(), 0);
}
