//! `rshmem doctor` end to end: runs the built binary and checks its report against facts
//! computed independently here. Fake libcuda/libibverbs libraries (compiled with `cc`)
//! exercise the code paths this machine has no hardware for.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

const BIN: &str = env!("CARGO_BIN_EXE_rshmem");
const LIBFABRIC: &str = "/usr/lib/x86_64-linux-gnu/libfabric.so.1";

fn doctor(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.arg("doctor")
        .args(args)
        .env_remove("RSHMEM_CUDA_LIB")
        .env_remove("RSHMEM_PTX_DIR");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("run rshmem doctor")
}

fn parse(out: &Output) -> Value {
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout.clone()).expect("UTF-8 output");
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"))
}

fn summary_line(j: &Value, transport: &str) -> Value {
    j["summary"]
        .as_array()
        .expect("summary array")
        .iter()
        .find(|t| t["transport"] == transport)
        .unwrap_or_else(|| panic!("no summary line for {transport}: {j}"))
        .clone()
}

/// One `doctor --json` run shared by the tests below, with a node id and a secret set.
fn report() -> &'static (Output, Value) {
    static REPORT: OnceLock<(Output, Value)> = OnceLock::new();
    REPORT.get_or_init(|| {
        let out = doctor(
            &["--json"],
            &[
                ("RSHMEM_NODE_ID", "rack7-node3"),
                ("RSHMEM_TOKEN", "do-not-print-me"),
                ("RSHMEM_TIMEOUT_MS", "1234"),
            ],
        );
        let json = parse(&out);
        (out, json)
    })
}

fn libcuda_loads() -> bool {
    ["libcuda.so.1", "libcuda.so"].iter().any(|name| {
        // SAFETY: loading the CUDA driver library runs only its own initialisers.
        unsafe { libloading::Library::new(name) }.is_ok()
    })
}

#[test]
fn json_has_every_section_and_exits_zero() {
    let (out, j) = report();
    assert_eq!(out.status.code(), Some(0));
    for key in ["cpu", "cuda", "rdma", "ibgda", "libfabric", "summary"] {
        assert!(j.get(key).is_some(), "missing key {key} in {j}");
    }
    for key in ["present", "detail", "driver_version", "devices"] {
        assert!(j["cuda"].get(key).is_some(), "cuda.{key} missing");
    }
    for key in [
        "present",
        "devices",
        "mlx5",
        "peermem",
        "peer_mapping_override",
    ] {
        assert!(j["rdma"].get(key).is_some(), "rdma.{key} missing");
    }
    for key in ["present", "version", "providers"] {
        assert!(j["libfabric"].get(key).is_some(), "libfabric.{key} missing");
    }
}

#[test]
fn cpu_section_matches_this_machine() {
    let (out, j) = report();
    let cpu = &j["cpu"];
    let n = std::thread::available_parallelism().unwrap().get() as u64;
    assert_eq!(cpu["count"].as_u64(), Some(n));
    assert_eq!(cpu["available"], Value::Bool(true));
    assert_eq!(cpu["node_id"], "rack7-node3");
    assert_eq!(cpu["node_id_source"], "RSHMEM_NODE_ID");
    let total = cpu["shm"]["total_bytes"].as_u64().expect("shm total");
    let free = cpu["shm"]["free_bytes"].as_u64().expect("shm free");
    assert!(total > 0 && free <= total);
    let env = cpu["env"].as_array().unwrap();
    let get = |name: &str| {
        env.iter()
            .find(|e| e["name"] == name)
            .map(|e| e["value"].as_str().unwrap().to_string())
    };
    assert_eq!(get("RSHMEM_TIMEOUT_MS").as_deref(), Some("1234"));
    assert_eq!(get("RSHMEM_TOKEN").as_deref(), Some("(hidden)"));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("do-not-print-me"));
}

#[test]
fn node_id_defaults_to_hostname_and_boot_id() {
    let out = Command::new(BIN)
        .args(["doctor", "--json"])
        .env_remove("RSHMEM_NODE_ID")
        .output()
        .unwrap();
    let j = parse(&out);
    let host = j["cpu"]["hostname"].as_str().unwrap();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert_eq!(
        j["cpu"]["node_id"].as_str().unwrap(),
        format!("{host}:{}", &boot.trim()[..8])
    );
}

#[test]
fn cuda_presence_matches_dlopen() {
    let (_, j) = report();
    let cuda = &j["cuda"];
    let present = libcuda_loads();
    assert_eq!(cuda["present"].as_bool(), Some(present));
    if !present {
        assert_eq!(
            cuda["detail"],
            "absent: libcuda.so.1 not found (install the NVIDIA driver)"
        );
        assert!(cuda["driver_version"].is_null());
        assert_eq!(cuda["devices"].as_array().unwrap().len(), 0);
        assert_eq!(
            summary_line(j, "p2p (GPUs)")["available"],
            Value::Bool(false)
        );
    }
}

#[test]
fn libfabric_providers_when_installed() {
    let (_, j) = report();
    let fab = &j["libfabric"];
    let installed = Path::new(LIBFABRIC).exists();
    assert_eq!(fab["present"].as_bool(), Some(installed));
    if installed {
        let providers = fab["providers"].as_array().unwrap();
        assert!(!providers.is_empty(), "no providers: {fab}");
        let version = fab["version"].as_str().unwrap();
        let (major, _) = version.split_once('.').expect("major.minor");
        assert_eq!(major, "1");
        // Providers are listed once each, and the hints asked for RMA and atomics.
        let mut names: Vec<&str> = providers
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), providers.len());
        assert!(providers
            .iter()
            .any(|p| p["rma"] == true && p["atomic"] == true));
        assert_eq!(
            summary_line(j, "proxy over libfabric")["available"],
            Value::Bool(true)
        );
    } else {
        assert!(fab["detail"].as_str().unwrap().contains("libfabric1"));
    }
}

#[test]
fn rdma_section_is_consistent() {
    let (_, j) = report();
    let rdma = &j["rdma"];
    let peermem = Path::new("/sys/module/nvidia_peermem").exists();
    assert_eq!(rdma["peermem"].as_bool(), Some(peermem));
    if !Path::new("/proc/driver/nvidia/params").exists() {
        assert!(rdma["peer_mapping_override"].is_null());
    }
    if rdma["present"] == false {
        assert!(rdma["detail"].as_str().unwrap().contains("libibverbs1"));
    }
    if rdma["devices"].as_array().unwrap().is_empty() {
        let ibgda = summary_line(j, "ibgda");
        assert_eq!(ibgda["available"], Value::Bool(false));
    }
}

/// The rdma-core line and the IBGDA capabilities, checked against facts gathered here.
#[test]
fn ibgda_section_matches_this_machine() {
    let (_, j) = report();
    let rdma = &j["rdma"];
    let g = &j["ibgda"];
    for key in ["mlx5_device", "dmabuf", "peermem", "doorbell_mapping"] {
        let state = g[key]["state"]
            .as_str()
            .unwrap_or_else(|| panic!("ibgda.{key}: {g}"));
        assert!(["yes", "no", "unknown"].contains(&state), "{key}: {state}");
    }
    let peermem = Path::new("/sys/module/nvidia_peermem").exists();
    assert_eq!(g["peermem"]["state"], if peermem { "yes" } else { "no" });
    let no_devices = rdma["devices"].as_array().unwrap().is_empty();
    if rdma["present"] == true && no_devices {
        let detail = rdma["detail"].as_str().unwrap();
        // e.g. "found (libibverbs.so.1 44.0), 0 RDMA devices"
        assert!(detail.starts_with("found (libibverbs.so.1"), "{detail}");
        assert!(detail.contains("), 0 RDMA devices"), "{detail}");
        let ver = rdma["version"].as_str().unwrap();
        assert!(
            detail.starts_with(&format!("found (libibverbs.so.1 {ver}), ")),
            "{detail}"
        );
        assert_eq!(g["mlx5_device"]["detail"], "no mlx5 device");
        assert_eq!(g["gpu_pe_path"], "proxy over libfabric: no mlx5 device");
        assert_eq!(g["plan"]["path"], "proxy");
        assert_eq!(
            g["doorbell_mapping"]["detail"],
            "unknown: needs a GPU and an mlx5 device"
        );
        let table = String::from_utf8(doctor(&[], &[]).stdout).unwrap();
        assert!(
            table.contains(&format!("  rdma-core              {detail}")),
            "{table}"
        );
        assert!(
            table.contains("  GPU PE path            proxy over libfabric: no mlx5 device"),
            "{table}"
        );
    }
}

#[test]
fn table_has_every_section() {
    let out = doctor(&[], &[("RSHMEM_TOKEN", "do-not-print-me")]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    for header in ["CPU PEs", "CUDA", "rdma-core", "libfabric", "Summary"] {
        assert!(
            text.lines().any(|l| l.starts_with(header)),
            "no section {header}:\n{text}"
        );
    }
    assert!(text.contains("p2p (CPU PEs): yes"), "{text}");
    assert!(text.contains("RSHMEM_TOKEN=(hidden)"), "{text}");
    assert!(!text.contains("do-not-print-me"));
    if !libcuda_loads() {
        assert!(text.contains("absent: libcuda.so.1 not found (install the NVIDIA driver)"));
    }
}

// ---- fake driver libraries -------------------------------------------------------------

/// A stand-in libcuda.so.1: two devices, the second of which fails cuDeviceGetName;
/// FAKE_CUDA_INIT_RC makes cuInit fail with that code.
const FAKE_CUDA_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int cuInit(unsigned int flags) {
    const char *rc = getenv("FAKE_CUDA_INIT_RC");
    if (flags != 0) return 1;
    return rc ? atoi(rc) : 0;
}
int cuDriverGetVersion(int *v) { *v = 13000; return 0; }
int cuDeviceGetCount(int *n) { *n = 2; return 0; }
int cuDeviceGet(int *d, int ordinal) {
    if (ordinal < 0 || ordinal > 1) return 101;
    *d = ordinal;
    return 0;
}
int cuDeviceGetName(char *name, int len, int d) {
    if (d == 1) return 101;
    snprintf(name, len, "Fake H200 %d", d);
    return 0;
}
int cuDeviceTotalMem_v2(size_t *bytes, int d) { *bytes = (size_t)143771 << 20; return 0; }
int cuDeviceGetAttribute(int *v, int attr, int d) {
    if (attr == 75) { *v = 9; return 0; }
    if (attr == 76) { *v = 0; return 0; }
    if (attr == 102 || attr == 103) { *v = 1; return 0; }  /* VMM, POSIX-fd handles */
    if (attr == 110) { *v = d == 0; return 0; }            /* GPUDirect RDMA with VMM */
    if (attr == 118) { *v = d == 0 ? 100 : 0; return 0; }  /* RDMA writes ordering */
    return 1;                                              /* dma-buf (124): unknown */
}
int cuDeviceCanAccessPeer(int *ok, int d, int peer) {
    if (d == 1 && peer == 0) return 101;
    *ok = (d == 0 && peer == 1);
    return 0;
}
int cuDeviceGetP2PAttribute(int *v, int attr, int src, int dst) {
    if (attr != 3 || src != 0 || dst != 1) return 1;
    *v = 0;                                                /* PCIe without atomics */
    return 0;
}
int cuDeviceGetPCIBusId(char *id, int len, int d) {
    if (d == 1) return 101;
    snprintf(id, len, "0000:1B:00.0");
    return 0;
}
int cuGetErrorName(int rc, const char **s) {
    switch (rc) {
    case 100: *s = "CUDA_ERROR_NO_DEVICE"; return 0;
    case 101: *s = "CUDA_ERROR_INVALID_DEVICE"; return 0;
    default: *s = 0; return 1;
    }
}
"#;

/// A stand-in libibverbs.so.1 with one device named mlx5_0.
const FAKE_VERBS_C: &str = r#"
#include <stdlib.h>
static int dev0;
struct ibv_device;
struct ibv_device **ibv_get_device_list(int *n) {
    struct ibv_device **l = calloc(2, sizeof(*l));
    l[0] = (struct ibv_device *)&dev0;
    *n = 1;
    return l;
}
const char *ibv_get_device_name(struct ibv_device *d) { return d ? "mlx5_0" : 0; }
void ibv_free_device_list(struct ibv_device **l) { free(l); }
"#;

/// Builds `soname` from `source` into its own directory and returns that directory.
fn fake_library(dir_name: &str, soname: &str, source: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(dir_name);
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("fake.c");
    std::fs::write(&src, source).unwrap();
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", &format!("-Wl,-soname,{soname}"), "-o"])
        .arg(dir.join(soname))
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("cannot run cc ({e}); install gcc"));
    assert!(
        out.status.success(),
        "building fake {soname}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// RSHMEM_CUDA_LIB names the driver file for the doctor as for the runtime: a file that
/// is not there is "absent" on any machine; the stand-in is found off the loader path.
#[test]
fn the_doctor_loads_the_driver_file_rshmem_cuda_lib_names() {
    let j = parse(&doctor(
        &["--json"],
        &[("RSHMEM_CUDA_LIB", "/nonexistent/libcuda.so.1")],
    ));
    assert_eq!(j["cuda"]["present"], Value::Bool(false));
    assert_eq!(
        j["cuda"]["detail"],
        "absent: libcuda.so.1 could not be loaded: libcuda.so.1 not found at \
         RSHMEM_CUDA_LIB=/nonexistent/libcuda.so.1 (install the NVIDIA driver and point \
         RSHMEM_CUDA_LIB at its libcuda.so.1, or unset RSHMEM_CUDA_LIB)"
    );
    let dir = fake_library("fake-cuda-chosen", "libcuda.so.1", FAKE_CUDA_C);
    let lib = dir.join("libcuda.so.1");
    let j = parse(&doctor(
        &["--json"],
        &[
            ("RSHMEM_CUDA_LIB", lib.to_str().unwrap()),
            ("LD_LIBRARY_PATH", "/nonexistent"),
        ],
    ));
    assert_eq!(j["cuda"]["present"], Value::Bool(true));
    assert_eq!(
        j["cuda"]["detail"],
        format!("{} loaded, driver API 13.0, 2 device(s)", lib.display())
    );
    // Another libcuda.so found first on the loader path: the runtime refuses the chosen
    // file (gpu::driver), and the doctor says the same rather than "loaded".
    let other = fake_library("fake-cuda-other", "libcuda.so", FAKE_CUDA_C);
    let j = parse(&doctor(
        &["--json"],
        &[
            ("RSHMEM_CUDA_LIB", lib.to_str().unwrap()),
            ("LD_LIBRARY_PATH", other.to_str().unwrap()),
        ],
    ));
    assert_eq!(j["cuda"]["present"], Value::Bool(false));
    let detail = j["cuda"]["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!(
            "RSHMEM_CUDA_LIB={} is not the library the loader finds first as libcuda.so",
            lib.display()
        )),
        "{detail}"
    );
}

#[test]
fn fake_cuda_driver_is_reported_device_by_device() {
    let dir = fake_library("fake-cuda", "libcuda.so.1", FAKE_CUDA_C);
    let path = dir.to_str().unwrap();
    let j = parse(&doctor(&["--json"], &[("LD_LIBRARY_PATH", path)]));
    let cuda = &j["cuda"];
    assert_eq!(cuda["present"], Value::Bool(true));
    assert_eq!(cuda["driver_version"].as_i64(), Some(13000));
    assert_eq!(
        cuda["detail"],
        "libcuda.so.1 loaded, driver API 13.0, 2 device(s)"
    );
    let devs = cuda["devices"].as_array().unwrap();
    assert_eq!(devs.len(), 2);
    assert_eq!(devs[0]["name"], "Fake H200 0");
    assert_eq!(devs[0]["total_mem_bytes"].as_u64(), Some(143771 << 20));
    assert_eq!(devs[0]["compute_capability"], "9.0");
    assert_eq!(devs[0]["pci_bus_id"], "0000:1B:00.0");
    assert!(devs[1]["pci_bus_id"].is_null());
    assert!(devs[0]["error"].is_null());
    assert!(devs[1]["name"].is_null());
    assert_eq!(
        devs[1]["error"],
        "cuDeviceGetName failed: CUDA_ERROR_INVALID_DEVICE (101)"
    );
    assert_eq!(devs[1]["compute_capability"], "9.0");
    assert_eq!(summary_line(&j, "p2p (GPUs)")["detail"], "2 CUDA device(s)");
    assert_eq!(devs[0]["vmm"], Value::Bool(true));
    assert_eq!(devs[0]["posix_fd_handles"], Value::Bool(true));
    assert_eq!(devs[0]["gpudirect_rdma_vmm"], Value::Bool(true));
    assert_eq!(devs[1]["gpudirect_rdma_vmm"], Value::Bool(false));
    assert!(devs[0]["dma_buf"].is_null(), "unknown attribute: null");
    assert_eq!(devs[0]["gpudirect_rdma_writes_ordering"], "owner");
    assert_eq!(devs[1]["gpudirect_rdma_writes_ordering"], "none");
    let p2p = cuda["p2p"].as_array().unwrap();
    assert_eq!(p2p.len(), 2);
    assert_eq!(
        (p2p[0]["from"].as_i64(), p2p[0]["to"].as_i64()),
        (Some(0), Some(1))
    );
    assert_eq!(p2p[0]["access"], Value::Bool(true));
    assert_eq!(p2p[0]["native_atomics"], Value::Bool(false));
    assert!(p2p[0]["error"].is_null());
    assert!(p2p[1]["access"].is_null());
    assert!(p2p[1]["native_atomics"].is_null());
    // The rshmem binary gives CUDA 32 hardware queues unless the user exported a number.
    assert_eq!(cuda["hardware_queues"], 32);
    assert_eq!(
        p2p[1]["error"],
        "cuDeviceCanAccessPeer failed: CUDA_ERROR_INVALID_DEVICE (101)"
    );

    // How each library module would load on GPU 0 (compute capability 9.0).
    let modules = cuda["modules"].as_array().unwrap();
    assert_eq!(modules.len(), 5, "{modules:?}");
    assert!(
        modules
            .iter()
            .all(|m| m["load"] == "PTX (no RSHMEM_PTX_DIR)"),
        "{modules:?}"
    );
    let j = parse(&doctor(
        &["--json"],
        &[
            ("LD_LIBRARY_PATH", path),
            ("RSHMEM_PTX_DIR", "/nonexistent"),
        ],
    ));
    let m = j["cuda"]["modules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["module"] == "rshmem_kernels")
        .cloned()
        .unwrap();
    assert_eq!(
        m["load"],
        "PTX (no /nonexistent/rshmem_kernels.sm_90.cubin)"
    );

    let j = parse(&doctor(
        &["--json"],
        &[("LD_LIBRARY_PATH", path), ("FAKE_CUDA_INIT_RC", "100")],
    ));
    assert_eq!(j["cuda"]["present"], Value::Bool(true));
    assert_eq!(
        j["cuda"]["detail"],
        "libcuda.so.1 loaded, driver API 13.0; cuInit failed: CUDA_ERROR_NO_DEVICE (100)"
    );
    assert_eq!(j["cuda"]["devices"].as_array().unwrap().len(), 0);

    let table = doctor(&[], &[("LD_LIBRARY_PATH", path)]);
    let text = String::from_utf8(table.stdout).unwrap();
    assert!(
        text.contains("GPU 0                  Fake H200 0, 140.4 GiB, compute capability 9.0, PCI 0000:1B:00.0"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("module rshmem_kernels")
                && l.ends_with(" PTX (no RSHMEM_PTX_DIR)")),
        "{text}"
    );
    assert!(
        text.contains(
            "VMM yes, POSIX-fd handles yes, GPUDirect RDMA with VMM yes, dma-buf ?, \
             RDMA write ordering owner"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "P2P 0 -> 1             yes, without native atomics (read-modify-write atomics and \
             signal ADDs to PEs there are refused)"
        ),
        "{text}"
    );
    assert!(
        text.contains("HW queues              32 per GPU (CUDA_DEVICE_MAX_CONNECTIONS): up to 30 GPU PEs per GPU per process"),
        "{text}"
    );
    assert!(
        text.contains("cuDeviceCanAccessPeer failed: CUDA_ERROR_INVALID_DEVICE (101)"),
        "{text}"
    );
}

#[test]
fn fake_mlx5_device_is_found_and_named_in_the_ibgda_line() {
    let cuda = fake_library("fake-cuda-ibgda", "libcuda.so.1", FAKE_CUDA_C);
    let verbs = fake_library("fake-verbs", "libibverbs.so.1", FAKE_VERBS_C);
    let path = format!("{}:{}", cuda.display(), verbs.display());
    let j = parse(&doctor(&["--json"], &[("LD_LIBRARY_PATH", &path)]));
    let rdma = &j["rdma"];
    assert_eq!(rdma["present"], Value::Bool(true));
    // The fake's file name carries no rdma-core release, and it lacks ibv_open_device.
    assert_eq!(rdma["detail"], "found (libibverbs.so.1), 1 RDMA device");
    assert!(rdma["version"].is_null());
    let devs = rdma["devices"].as_array().unwrap();
    assert_eq!(devs.len(), 1);
    assert_eq!(devs[0]["name"], "mlx5_0");
    assert_eq!(devs[0]["mlx5"], Value::Bool(true));
    // It could not be opened: no atomic capability, no active port, so no GPU has a NIC.
    assert!(devs[0]["atomic_cap"].is_null());
    assert_eq!(j["ibgda"]["nics"], Value::Array(vec![]));
    // The real libmlx5 needs symbols of the real libibverbs, so next to the fake it may
    // not load; the ibgda line is available exactly when it does, and names mlx5 either way.
    let ibgda = summary_line(&j, "ibgda");
    assert!(
        ibgda["detail"].as_str().unwrap().contains("mlx5"),
        "{ibgda}"
    );
    assert_eq!(ibgda["available"], rdma["mlx5"]);
}
