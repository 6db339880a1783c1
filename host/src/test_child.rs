//! Unit tests that need a process-wide condition (no CUDA driver, no NVRTC) run their body
//! in a child process of the test binary with the environment that creates it, so they
//! check the same thing on every machine instead of returning early where a driver exists.
//!
//! Usage, first line of the test:
//! `if !test_child::run_without_cuda(module_path!(), "the_test_fn") { return; }`:
//! in the parent this re-runs exactly that test in a child with `RSHMEM_CUDA_LIB` and
//! `RSHMEM_NVRTC_LIB` at files that are not there, asserts that the child ran it and it
//! passed, and returns false; in the child it returns true and the body runs.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a child may run before it is killed and the test fails.
const CHILD_TIMEOUT: Duration = Duration::from_secs(120);

/// The variable that marks the child (its value is the test's path).
const CHILD_ENV: &str = "RSHMEM_TEST_CHILD";

/// What the child's environment sets: no driver and no NVRTC, whatever the machine has.
pub const NO_CUDA_ENV: &[(&str, &str)] = &[
    ("RSHMEM_CUDA_LIB", "/nonexistent/libcuda.so.1"),
    ("RSHMEM_NVRTC_LIB", "/nonexistent/libnvrtc.so.13"),
];

/// True in a child started by [`run_in_child`] (for work only the parent should do, such
/// as building files the child then reads).
pub fn in_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
}

/// See the module doc. `module` is `module_path!()` of the test, `name` its function.
pub fn run_without_cuda(module: &str, name: &str) -> bool {
    run_in_child(module, name, NO_CUDA_ENV)
}

/// Re-runs test `module::name` in a child with `env` set (parent: asserts it passed and
/// returns false) or, in that child, returns true.
pub fn run_in_child(module: &str, name: &str, env: &[(&str, &str)]) -> bool {
    // libtest filters on the path without the crate name.
    let path = match module.split_once("::") {
        Some((_crate, rest)) => format!("{rest}::{name}"),
        None => name.to_string(),
    };
    if std::env::var(CHILD_ENV).as_deref() == Ok(path.as_str()) {
        for (k, v) in env {
            assert_eq!(
                std::env::var(k).as_deref(),
                Ok(*v),
                "the child of {path} lacks {k}"
            );
        }
        return true;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut child = Command::new(exe)
        .args([path.as_str(), "--exact", "--test-threads=1", "--nocapture"])
        .env(CHILD_ENV, &path)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the test binary again");
    // Readers on their own threads, so a child that writes much never blocks on a pipe.
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            v
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + CHILD_TIMEOUT;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait for the child") {
            break Some(st);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.join().unwrap_or_default()),
        String::from_utf8_lossy(&err.join().unwrap_or_default())
    );
    let Some(status) = status else {
        panic!("{path} did not finish in its child within {CHILD_TIMEOUT:?} (killed):\n{text}");
    };
    assert!(status.success(), "{path} failed in its child:\n{text}");
    assert!(
        text.contains("test result: ok. 1 passed"),
        "{path} did not run in its child:\n{text}"
    );
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The child really has the environment, and a failing body fails the parent.
    #[test]
    fn the_child_sees_the_environment() {
        if !run_in_child(
            module_path!(),
            "the_child_sees_the_environment",
            &[("RSHMEM_TEST_CHILD_PROBE", "42")],
        ) {
            return;
        }
        assert_eq!(
            std::env::var("RSHMEM_TEST_CHILD_PROBE").as_deref(),
            Ok("42")
        );
    }

    #[test]
    fn a_child_that_fails_fails_the_parent() {
        if std::env::var("RSHMEM_TEST_CHILD_FAIL").is_ok() {
            panic!("this child fails on purpose");
        }
        let r = std::panic::catch_unwind(|| {
            run_in_child(
                module_path!(),
                "a_child_that_fails_fails_the_parent",
                &[("RSHMEM_TEST_CHILD_FAIL", "1")],
            )
        });
        let msg = r.expect_err("the parent must fail");
        let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("failed in its child"), "{msg}");
        assert!(msg.contains("this child fails on purpose"), "{msg}");
    }
}
