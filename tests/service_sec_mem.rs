//! The device service reaches only memory its client could reach itself
//! (docs/rnic.md, "How the service touches a client's memory"; src/service/client_mem.rs):
//! an unprivileged client that opens the device, forks and lets the process that
//! connected exec another program cannot register, read or write that program's memory
//! through its old connection, whether the program is set-uid root or ordinary.
//!
//! tests/c/svc_mem_attack.c is the attacker (run as nobody through `xrnic exec`),
//! tests/c/svc_mem_hello.c one that speaks the service's protocol itself (so that it can
//! say hello after the exec), tests/c/svc_mem_victim.c the victim they become; all built
//! with cc here (the first against libibverbs-dev's headers). Root tests (`#[ignore = "needs root"]`,
//! docs/testing.md); the library must be built (`cargo build --workspace`).

mod common;
mod service_support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::text;
use service_support::{Kid, Svc, out};

/// tests/c/NAME.c built as `dir/NAME` (with libibverbs when `verbs`).
fn build(dir: &Path, name: &str, verbs: bool) -> PathBuf {
    let exe = dir.join(name);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let mut cc = Command::new("cc");
    cc.args(["-Wall", "-Wextra", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(&src);
    if verbs {
        cc.arg("-libverbs");
    }
    let o = cc.output().expect("cc (the tests need a C compiler)");
    assert!(o.status.success(), "cc {name}: {}", text(&o));
    exe
}

/// A fresh root-owned directory (mode 0755: nobody may run what is in it, not change
/// it) with the attacker and two copies of the victim: `victim-suid` set-uid root
/// (4755) and `victim` ordinary (0755).
struct Progs {
    dir: PathBuf,
    attack: PathBuf,
    hello: PathBuf,
}

impl Progs {
    fn new(tag: &str) -> Progs {
        let dir = std::env::temp_dir().join(format!("xrnic-secmem-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let attack = build(&dir, "svc_mem_attack", true);
        let hello = build(&dir, "svc_mem_hello", false);
        let victim = build(&dir, "svc_mem_victim", false);
        std::fs::copy(&victim, dir.join("victim-suid")).unwrap();
        std::fs::set_permissions(
            dir.join("victim-suid"),
            std::fs::Permissions::from_mode(0o4755),
        )
        .unwrap();
        std::fs::rename(&victim, dir.join("victim")).unwrap();
        std::fs::set_permissions(dir.join("victim"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        Progs { dir, attack, hello }
    }
}

impl Drop for Progs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The attack against `victim` (a file of `p.dir`) as nobody: the attacker's stdout and
/// the victim's report (stderr).
fn attack(s: &Svc, p: &Progs, victim: &str) -> (String, String) {
    let dev = format!("xrnic_{}", s.ifname());
    let victim = p.dir.join(victim);
    // `--no-view`: in the user namespace of the device view root is unmapped and a
    // set-uid root program runs as its caller (user_namespaces(7)), which would leave no
    // set-uid victim to attack.
    let mut c = s.as_nobody(&[
        common::xrnic_bin(),
        "exec",
        "--no-view",
        "--netdev",
        s.ifname(),
        "--",
        p.attack.to_str().unwrap(),
        &dev,
        victim.to_str().unwrap(),
    ]);
    c.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let kid = Kid(Some(c.spawn().unwrap()));
    let o = kid.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "attack: {}", text(&o));
    (out(&o), err)
}

/// What the attack must end in: it ran to its end (so the checks below are not vacuous),
/// the victim was the program meant (`euid`), its page did not change, and the old
/// connection could not even register the victim's page (its first and last byte, the
/// registration's probe, are out of reach too), so no WRITE or READ was posted.
fn assert_refused(what: &str, attacker: &str, victim: &str, euid: u32) {
    let all = format!("attacker:\n{attacker}\nvictim:\n{victim}");
    assert!(attacker.contains("attack: done"), "{what}: {all}");
    assert!(
        victim.contains(&format!("victim euid={euid} ")),
        "{what}: not the victim meant: {all}"
    );
    assert!(
        victim.contains(" intact"),
        "{what}: the victim's page changed: {all}"
    );
    assert!(
        attacker.contains("attack: reg refused"),
        "{what}: the victim's page was registered: {all}"
    );
}

/// Item 1 of the service's local threat model (docs/security.md): a client that opens the
/// device, forks, and exec's a set-uid root program in the process that connected. The
/// forked child still holds the connection; registering the set-uid program's heap page
/// through it is refused (the service's handle was bound at hello to the memory of the
/// program before the exec, which is gone), so no WRITE or READ between two QPs of that
/// connection reaches root's page. On a service that copies by pid with its own (root)
/// rights, the registration succeeds and the WRITE copies root's bytes over root's page.
#[test]
#[cfg_attr(not(xrnic_no_libibverbs_dev), ignore = "needs root")]
#[cfg_attr(xrnic_no_libibverbs_dev, ignore = "needs root and libibverbs-dev")]
fn a_client_that_execs_a_setuid_program_cannot_reach_its_memory() {
    let s = Svc::start();
    let p = Progs::new("suid");
    let (a, v) = attack(&s, &p, "victim-suid");
    assert_refused("set-uid victim", &a, &v, 0);
    // The service goes on serving: root lists its (now empty of the attacker) resources.
    s.res();
}

/// The same with an ordinary program (same user): after the exec the old connection's
/// registrations no longer reach the process that connected, since its memory is not
/// the memory that said hello. The pid is the same; only the address space counts.
#[test]
#[cfg_attr(not(xrnic_no_libibverbs_dev), ignore = "needs root")]
#[cfg_attr(xrnic_no_libibverbs_dev, ignore = "needs root and libibverbs-dev")]
fn after_an_exec_the_old_connection_reaches_nothing_of_the_new_program() {
    let s = Svc::start();
    let p = Progs::new("plain");
    let (a, v) = attack(&s, &p, "victim");
    assert_refused("ordinary victim", &a, &v, 65534);
    s.res();
}

/// The same attack with the hello said after the exec: the process that connected is
/// then the set-uid program when the service opens its memory, and the check with the
/// client's credentials (nobody's, SO_PEERCRED's at connect) refuses it: the hello fails
/// with EPERM, so there is no PD to register in, and the registration's probe never
/// reads root's page. On a service that binds a client to its pid, the hello succeeds
/// and the registration of root's page (its first and last byte read as root) too.
#[test]
#[cfg_attr(not(xrnic_no_libibverbs_dev), ignore = "needs root")]
#[cfg_attr(xrnic_no_libibverbs_dev, ignore = "needs root and libibverbs-dev")]
fn a_hello_from_a_connection_whose_process_became_setuid_is_refused() {
    let s = Svc::start();
    let p = Progs::new("hello");
    let victim = p.dir.join("victim-suid");
    let kid = Kid(Some(
        s.as_nobody(&[
            p.hello.to_str().unwrap(),
            s.ifname(),
            victim.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap(),
    ));
    let o = kid.wait_with_output().unwrap();
    assert!(o.status.success(), "attack: {}", text(&o));
    let (a, v) = (out(&o), String::from_utf8_lossy(&o.stderr).into_owned());
    let all = format!("attacker:\n{a}\nvictim:\n{v}");
    assert!(a.contains("attack: done"), "{all}");
    assert!(v.contains("victim euid=0 intact"), "{all}");
    let hello = a.lines().find(|l| l.starts_with("hello: ")).unwrap_or("");
    assert!(
        hello.contains("\"Err\"") && hello.contains("\"errno\":1,"),
        "the hello was not refused with EPERM: {all}"
    );
    assert!(!a.contains("reg: "), "a registration was tried: {all}");
    s.res();
}
