//! winefs as mount(8)'s helper: `mount -t winefs POOL DIR -o OPTIONS` and /etc/fstab lines.
//!
//! mount(8) runs `/sbin/mount.TYPE SPEC DIR [-sfnv] [-N NAMESPACE] [-o OPTIONS] [-t TYPE]`
//! for a type the kernel does not know itself. Installed as a link named `mount.winefs` (for
//! `-t winefs`) or `mount.fuse.winefs` (for `-t fuse.winefs`, the name in the mount table and
//! the one test suites such as xfstests use), the `winefs` binary takes that form, turns the
//! options into `winefs mount`'s and mounts in the background as `winefs mount` does.
//!
//! Every option is either used or refused in one line: a line in fstab that asked for
//! something winefs does not do must not mount as if it had not (mount's `-s`, "sloppy",
//! turns the refusal of an unknown option into a warning). Options only mount(8), fstab or
//! systemd read (`defaults`, `noauto`, `nofail`, `_netdev`, `x-systemd.*`, ...) are passed over.

use crate::bind::{contradicted, daemon_settings};
use crate::fail::{Fail, fail};
use crate::mount::{self, MountArgs, Transport};
use clap::Parser;
use clap::error::ErrorKind;
use fuser::MountOption;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use winefs::Consistency;
use winefs::sys;

/// The names the binary answers to as mount(8)'s helper.
const HELPER_NAMES: [&str; 2] = ["mount.winefs", "mount.fuse.winefs"];

/// The file system types the helper mounts (`-t`).
const TYPES: [&str; 2] = ["winefs", "fuse.winefs"];

/// Options only mount(8), fstab, systemd or libmount read: passed over.
const MOUNT8_ONLY: [&str; 13] = [
    "defaults", "auto", "noauto", "nofail", "_netdev", "user", "users", "nouser", "owner",
    "group", "async", "relatime", "default_permissions",
];

/// mount(8)'s exit status for a mount that failed (its status 1 is a wrong invocation).
const MOUNT_FAILED: u8 = 32;

/// The helper's command line, as mount(8) builds it.
#[derive(Parser, Debug)]
#[command(name = "mount.winefs", about = "mount(8) helper for winefs pools")]
struct HelperCli {
    /// The pool file or device.
    spec: PathBuf,
    /// The directory to mount on.
    dir: PathBuf,
    /// Sloppy: warn about options this helper does not know instead of refusing them.
    #[arg(short = 's')]
    sloppy: bool,
    /// Fake: check everything, mount nothing.
    #[arg(short = 'f')]
    fake: bool,
    /// No /etc/mtab to write (there never is one).
    #[arg(short = 'n')]
    no_mtab: bool,
    /// Verbose: say what was mounted.
    #[arg(short = 'v')]
    verbose: bool,
    /// Mount in another mount namespace (not offered).
    #[arg(short = 'N')]
    namespace: Option<String>,
    /// Comma-separated options (may be given more than once).
    #[arg(short = 'o', action = clap::ArgAction::Append)]
    options: Vec<String>,
    /// The type mount(8) was asked for.
    #[arg(short = 't')]
    fstype: Option<String>,
}

/// The helper's name, if the binary was invoked under one (`argv[0]`).
pub(crate) fn invoked_as() -> Option<&'static str> {
    let argv0 = std::env::args_os().next()?;
    let name = Path::new(&argv0).file_name()?.to_str()?;
    HELPER_NAMES.into_iter().find(|h| *h == name)
}

/// Mount as mount(8) asked `name` to.
pub(crate) fn run(name: &str) -> Result<u8, Fail> {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    run_with(name, args)
}

fn run_with(name: &str, args: Vec<OsString>) -> Result<u8, Fail> {
    let cli = match HelperCli::try_parse_from(std::iter::once(OsString::from(name)).chain(args)) {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            print!("{e}");
            return Ok(0);
        }
        Err(e) => {
            // clap's message is several lines (then usage); mount(8) shows the helper's
            // output as is: one line, its first paragraph.
            let text = e.to_string();
            let words: Vec<&str> =
                text.lines().map(str::trim).take_while(|l| !l.is_empty()).collect();
            return Err(fail(name, words.join(" ").trim_start_matches("error: ")));
        }
    };
    if options(&cli).any(|o| o == "remount") {
        let r = plan_remount(&cli)?;
        for w in &r.warnings {
            log::warn!("{w}");
        }
        return match cli.fake {
            true => Ok(0),
            false => remount(&cli.dir, &r).map_err(|mut f| {
                f.code = MOUNT_FAILED;
                f
            }),
        };
    }
    let plan = plan(&cli, sys::euid() == 0)?;
    for w in &plan.warnings {
        log::warn!("{w}");
    }
    if cli.fake {
        // What `winefs mount` checks before it touches the pool.
        mount::check_mountpoint(&cli.dir, plan.args.nonempty)?;
        std::fs::metadata(&cli.spec)
            .map_err(|e| fail(format!("mount {}", cli.spec.display()), e))?;
        return Ok(0);
    }
    mount::run(plan.args).map_err(|mut f| {
        f.code = MOUNT_FAILED;
        f
    })
}

/// What the helper will do: `winefs mount`'s arguments and the options it passed over.
#[derive(Debug)]
struct Plan {
    args: MountArgs,
    warnings: Vec<String>,
}

/// The type and namespace asked for are this helper's to serve.
fn check_invocation(cli: &HelperCli) -> Result<(), Fail> {
    if let Some(t) = &cli.fstype
        && !TYPES.contains(&t.as_str())
    {
        return Err(fail(
            "mount.winefs",
            format!("asked to mount type {t}; this helper mounts winefs pools (-t winefs or -t fuse.winefs)"),
        ));
    }
    if cli.namespace.is_some() {
        return Err(fail(
            "mount.winefs",
            "-N (mount in another namespace) is not offered; run mount inside that namespace",
        ));
    }
    Ok(())
}

/// Turn mount(8)'s arguments into `winefs mount`'s; `root`: the helper runs as root.
fn plan(cli: &HelperCli, root: bool) -> Result<Plan, Fail> {
    check_invocation(cli)?;
    let mut args = MountArgs {
        pool: Some(cli.spec.clone()),
        mountpoint: Some(cli.dir.clone()),
        consistency: Consistency::Strict,
        threads: None,
        foreground: false,
        nonempty: false,
        read_only: false,
        no_direct: false,
        writeback_cache: false,
        transport: Transport::Auto,
        wear_aware: false,
        noatime: false,
        noacl: false,
        cached_inodes: 0,
        size: None,
        log: None,
        // As ext4's: set-user-ID files and devices count unless the options say otherwise
        // (mount(8) never passes `suid` or `dev` on, only their opposites). A user's mount is
        // nosuid and nodev whatever it asks (fusermount3).
        kernel_flags: if root {
            vec![MountOption::Suid, MountOption::Dev]
        } else {
            Vec::new()
        },
        quiet: !cli.verbose,
    };
    let mut warnings = Vec::new();
    let mut mode: Option<&str> = None;
    let mut sync: Option<&str> = None;
    for opt in options(cli) {
        let (key, value) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        let bad = |why: &str| fail("mount.winefs", format!("option {opt}: {why}"));
        let number = |v: Option<&str>| -> Result<u64, Fail> {
            v.and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| bad("expects a whole number, as in threads=4"))
        };
        match (key.replace('-', "_").as_str(), value) {
            (k, None) if MOUNT8_ONLY.contains(&k) => {}
            (k, _) if k.starts_with("x_") || k == "comment" || k == "user" => {}
            // A later option overrides an earlier one, as mount(8)'s do.
            ("ro", None) => args.read_only = true,
            ("rw", None) => args.read_only = false,
            ("atime", None) => args.noatime = false,
            ("suid", None) => choose(&mut args.kernel_flags, MountOption::Suid, MountOption::NoSuid),
            ("nosuid", None) => choose(&mut args.kernel_flags, MountOption::NoSuid, MountOption::Suid),
            ("dev", None) => choose(&mut args.kernel_flags, MountOption::Dev, MountOption::NoDev),
            ("nodev", None) => choose(&mut args.kernel_flags, MountOption::NoDev, MountOption::Dev),
            ("exec", None) => choose(&mut args.kernel_flags, MountOption::Exec, MountOption::NoExec),
            ("noexec", None) => choose(&mut args.kernel_flags, MountOption::NoExec, MountOption::Exec),
            ("strict" | "relaxed", None) => {
                if mode.is_some_and(|m| m != key) {
                    return Err(bad("strict and relaxed were both given"));
                }
                mode = Some(key);
                args.consistency = if key == "relaxed" {
                    Consistency::Relaxed
                } else {
                    Consistency::Strict
                };
            }
            ("sync" | "dirsync", None) => sync = Some(key),
            ("noatime", None) => args.noatime = true,
            ("nonempty", None) => args.nonempty = true,
            ("no_direct" | "nodirect", None) => args.no_direct = true,
            ("writeback_cache", None) => args.writeback_cache = true,
            ("wear_aware", None) => args.wear_aware = true,
            ("threads", v) => match number(v)? {
                n @ 1..=64 => args.threads = Some(n as usize),
                _ => return Err(bad("threads are 1 to 64")),
            },
            ("cached_inodes", v) => match number(v)? {
                0 => return Err(bad("keep at least 1")),
                n => args.cached_inodes = n,
            },
            ("transport", v) => match v.map(|v| <Transport as clap::ValueEnum>::from_str(v, false)) {
                Some(Ok(t)) => args.transport = t,
                _ => return Err(bad("the transports are auto, uring and dev")),
            },
            ("log", Some(p)) if !p.is_empty() => args.log = Some(PathBuf::from(p)),
            ("allow_other", None) if root => {} // root's mount serves every user already
            ("allow_other", None) => {
                return Err(bad("a user's mount serves its owner only; mount as root to serve every user"));
            }
            ("acl", None) => args.noacl = false,
            ("noacl", None) => args.noacl = true,
            ("strictatime" | "norelatime" | "nodiratime" | "lazytime", None) => {
                return Err(bad(
                    "winefs stores access times as relatime does, or none with noatime",
                ));
            }
            _ if cli.sloppy => warnings.push(format!("ignored option {opt} (unknown to winefs)")),
            _ => return Err(bad("unknown to winefs (mount -s passes over unknown options)")),
        }
    }
    if let Some(s) = sync {
        // Strict mode already makes every change durable before the call returns; relaxed
        // mode's data is durable at fsync, which the kernel's flag would not change.
        if args.consistency == Consistency::Relaxed {
            return Err(fail(
                "mount.winefs",
                format!("option {s}: relaxed mode makes data durable at fsync; strict mode (the default) makes every write durable when it returns"),
            ));
        }
    }
    if args.writeback_cache && args.consistency != Consistency::Relaxed {
        return Err(fail(
            "mount.winefs",
            "option writeback_cache: only with relaxed (data durable at fsync)",
        ));
    }
    if args.writeback_cache && args.read_only {
        return Err(fail(
            "mount.winefs",
            "option writeback_cache: a read-only mount writes nothing",
        ));
    }
    Ok(Plan { args, warnings })
}

/// Every option given, in order.
fn options(cli: &HelperCli) -> impl Iterator<Item = &str> {
    cli.options.iter().flat_map(|o| o.split(',')).filter(|o| !o.is_empty())
}

/// What a remount changes: the mount's flags; what it must find the daemon started with
/// (`(setting, value, the option that asks for it)`: mount(8) passes the options of the
/// fstab line or command line again); and the options it passed over.
#[derive(Debug)]
struct Remount {
    flags: sys::RemountFlags,
    expect: Vec<(&'static str, String, String)>,
    warnings: Vec<String>,
}

/// `mount -o remount,...`: mount(8) passes the mount's present options with the new ones
/// after them (a later one wins). Read-only and the kernel's flags change; what the daemon
/// was started with (mode, threads, transport, ...) does not, so options naming those must
/// name what it has (checked in [`remount`]).
fn plan_remount(cli: &HelperCli) -> Result<Remount, Fail> {
    check_invocation(cli)?;
    let mut flags = sys::RemountFlags::default();
    let mut expect = Vec::new();
    let mut warnings = Vec::new();
    for opt in options(cli) {
        let (key, value) = match opt.split_once('=') {
            Some((k, v)) => (k.replace('-', "_"), v),
            None => (opt.replace('-', "_"), ""),
        };
        let mut want = |setting: &'static str, v: &str| expect.push((setting, v.to_string(), opt.to_string()));
        match key.as_str() {
            k if MOUNT8_ONLY.contains(&k) || k.starts_with("x_") => {}
            // The mount's present options as mount(8) passes them, and what only starting a
            // mount reads.
            "remount" | "allow_other" | "user_id" | "group_id" | "comment" | "nonempty" | "log" => {}
            "strict" | "sync" | "dirsync" => want("mode", "strict"),
            "relaxed" => want("mode", "relaxed"),
            "threads" => want("threads", value),
            "transport" => want("transport", value),
            "cached_inodes" => want("cached_inodes", value),
            "wear_aware" => want("wear_aware", "1"),
            "no_direct" | "nodirect" => want("no_direct", "1"),
            "writeback_cache" => want("writeback_cache", "1"),
            "acl" => want("acl", "1"),
            "noacl" => want("acl", "0"),
            "ro" => flags.read_only = true,
            "rw" => flags.read_only = false,
            "nosuid" => flags.nosuid = true,
            "suid" => flags.nosuid = false,
            "nodev" => flags.nodev = true,
            "dev" => flags.nodev = false,
            "noexec" => flags.noexec = true,
            "exec" => flags.noexec = false,
            "noatime" => flags.noatime = true,
            "atime" => flags.noatime = false,
            _ if cli.sloppy => warnings.push(format!("ignored option {opt} (unknown to winefs)")),
            _ => {
                return Err(fail(
                    "mount.winefs",
                    format!("option {opt}: unknown to winefs (mount -s passes over unknown options)"),
                ));
            }
        }
    }
    Ok(Remount { flags, expect, warnings })
}

/// Remount the winefs mount on `dir` as `r` says. To read-only, the kernel first (it refuses
/// while files are open for writing, and stops new writes), then the daemon (it stops its own
/// stores); to read-write, the daemon first. A step that fails undoes the one before it.
fn remount(dir: &Path, r: &Remount) -> Result<u8, Fail> {
    use winefs::fuse::{READ_ONLY_IOCTL, READ_WRITE_IOCTL};
    let flags = r.flags;
    let what = format!("remount {}", dir.display());
    let canon = std::fs::canonicalize(dir).map_err(|e| fail(&what, e))?;
    match sys::mountinfo::mounts().into_iter().rev().find(|m| m.point == canon) {
        // The daemon stores access times, by the rule it was started with: a remount that
        // changed the kernel's flag alone would show one thing and do another.
        Some(m) if m.fstype == "fuse.winefs" => {
            if m.options.iter().any(|o| o == "noatime") != flags.noatime {
                return Err(fail(
                    &what,
                    "noatime is not changed by a remount (the daemon stores access times by the rule it started with); unmount and mount again",
                ));
            }
        }
        Some(m) => return Err(fail(&what, format!("{} is mounted there, not winefs", m.fstype))),
        None => return Err(fail(&what, "nothing is mounted there")),
    }
    let root = std::fs::File::open(&canon).map_err(|e| fail(&what, e))?;
    let settings = daemon_settings(&root)
        .map_err(|e| fail(&what, format!("the daemon did not say how it serves ({e})")))?;
    if let Some(why) = contradicted(&r.expect, &settings) {
        return Err(fail(&what, format!("{why}, which a remount does not change; unmount and mount again")));
    }
    let kernel = |f: sys::RemountFlags| {
        sys::remount(&canon, f).map_err(|e| match e.kind() {
            std::io::ErrorKind::ResourceBusy => fail(
                &what,
                "busy: files are open for writing (or removed while open); close them first",
            ),
            _ => fail(&what, e),
        })
    };
    let daemon = |cmd: u32| sys::ioctl_no_data(&root, cmd);
    if flags.read_only {
        kernel(flags)?;
        if let Err(e) = daemon(READ_ONLY_IOCTL) {
            let _ = sys::remount(&canon, sys::RemountFlags { read_only: false, ..flags });
            return Err(fail(&what, format!("the daemon did not turn read-only ({e}); the mount stays read-write")));
        }
        return Ok(0);
    }
    if let Err(e) = daemon(READ_WRITE_IOCTL) {
        return Err(match e.kind() {
            std::io::ErrorKind::ReadOnlyFilesystem => fail(
                &what,
                "the pool was mounted read-only (any recovery was in memory only); unmount it and mount it read-write",
            ),
            _ => fail(&what, format!("the daemon did not turn read-write ({e})")),
        });
    }
    if let Err(f) = kernel(flags) {
        // Writes stay refused by the kernel; the daemon goes back to storing nothing.
        let _ = daemon(READ_ONLY_IOCTL);
        return Err(f);
    }
    Ok(0)
}

/// Keep `on` among the kernel flags instead of its opposite `off` (the later option wins).
fn choose(flags: &mut Vec<MountOption>, on: MountOption, off: MountOption) {
    flags.retain(|f| *f != on && *f != off);
    flags.push(on);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> HelperCli {
        HelperCli::try_parse_from(
            ["mount.winefs", "/pm/pool", "/mnt/w"].iter().chain(args),
        )
        .expect("helper arguments parse")
    }

    fn plan_of(args: &[&str]) -> Result<Plan, String> {
        plan(&cli(args), true).map_err(|f| f.err)
    }

    #[test]
    fn options_become_mount_arguments() {
        let p = plan_of(&[
            "-o",
            "rw,relaxed,noatime,threads=4,transport=dev,cached_inodes=100,nosuid,nodev,noexec",
            "-o",
            "wear-aware,nonempty,log=/var/log/w.log",
            "-t",
            "fuse.winefs",
        ])
        .unwrap();
        let a = &p.args;
        assert_eq!(a.consistency, Consistency::Relaxed);
        assert!(a.noatime && a.wear_aware && a.nonempty && !a.read_only);
        assert_eq!(a.threads, Some(4));
        assert_eq!(a.transport, Transport::Dev);
        assert_eq!(a.cached_inodes, 100);
        assert_eq!(a.log.as_deref(), Some(Path::new("/var/log/w.log")));
        assert_eq!(
            a.kernel_flags,
            vec![MountOption::NoSuid, MountOption::NoDev, MountOption::NoExec]
        );
        assert!(a.quiet, "silent unless -v, as mount helpers are");
        assert_eq!(a.pool.as_deref(), Some(Path::new("/pm/pool")));
        assert_eq!(a.mountpoint.as_deref(), Some(Path::new("/mnt/w")));
        assert!(p.warnings.is_empty());
    }

    #[test]
    fn fstab_and_systemd_options_are_passed_over() {
        let p = plan_of(&[
            "-o",
            "defaults,noauto,nofail,_netdev,x-systemd.automount,x-systemd.requires=a.mount,comment=x,user=alice,ro,noacl",
        ])
        .unwrap();
        assert!(p.args.read_only && p.args.noacl);
        assert_eq!(p.args.consistency, Consistency::Strict);
        assert_eq!(p.args.kernel_flags, vec![MountOption::Suid, MountOption::Dev]);
        let user = plan(&cli(&["-o", "ro"]), false).unwrap();
        assert!(user.args.kernel_flags.is_empty(), "fusermount3 decides a user's flags");
    }

    #[test]
    fn a_later_option_overrides_an_earlier_one() {
        let p = plan_of(&["-o", "ro,noatime,nosuid,noexec,dev", "-o", "rw,atime,suid,nodev"]).unwrap();
        assert!(!p.args.read_only && !p.args.noatime);
        assert_eq!(
            p.args.kernel_flags,
            vec![MountOption::NoExec, MountOption::Suid, MountOption::NoDev]
        );
    }

    #[test]
    fn what_winefs_does_not_do_is_refused_in_one_line() {
        for (opts, says) in [
            ("compress=zstd", "unknown to winefs"),
            ("strict,relaxed", "both given"),
            ("threads=0", "1 to 64"),
            ("threads=many", "whole number"),
            ("transport=tcp", "auto, uring and dev"),
            ("strictatime", "relatime"),
            ("relaxed,sync", "durable at fsync"),
            ("writeback_cache", "only with relaxed"),
            ("relaxed,writeback_cache,ro", "read-only"),
            ("cached_inodes=0", "at least 1"),
        ] {
            let err = plan_of(&["-o", opts]).expect_err(opts);
            assert!(err.contains(says), "{opts}: {err}");
            assert!(!err.contains('\n'), "{opts}: one line: {err}");
        }
        let err = plan(&cli(&["-o", "allow_other"]), false).unwrap_err().err;
        assert!(err.contains("mount as root"), "{err}");
        assert!(plan(&cli(&["-o", "allow_other"]), true).is_ok());
        let err = plan_of(&["-t", "ext4"]).unwrap_err();
        assert!(err.contains("type ext4"), "{err}");
        let err = plan_of(&["-N", "/proc/1/ns/mnt"]).unwrap_err();
        assert!(err.contains("namespace"), "{err}");
    }

    #[test]
    fn sloppy_warns_instead_of_refusing_unknown_options() {
        let p = plan_of(&["-s", "-o", "compress=zstd,relaxed"]).unwrap();
        assert_eq!(p.warnings.len(), 1, "{:?}", p.warnings);
        assert!(p.warnings[0].contains("compress=zstd"));
        assert_eq!(p.args.consistency, Consistency::Relaxed);
        // Sloppiness covers unknown options, not known ones used wrongly.
        assert!(plan_of(&["-s", "-o", "threads=0"]).is_err());
    }

    #[test]
    fn strict_mode_takes_sync_as_what_it_does_already() {
        let p = plan_of(&["-o", "sync,dirsync"]).unwrap();
        assert_eq!(p.args.consistency, Consistency::Strict);
        assert_eq!(p.args.kernel_flags, vec![MountOption::Suid, MountOption::Dev]);
    }

    #[test]
    fn a_remount_takes_the_flags_mount_passes_and_refuses_the_rest() {
        // What mount(8) passes for `mount -o remount,ro,noexec DIR`.
        let c = cli(&[
            "-o",
            "rw,nosuid,nodev,relatime,remount,ro,noexec,user_id=0,group_id=0,default_permissions,allow_other",
        ]);
        let r = plan_remount(&c).unwrap();
        assert_eq!(
            r.flags,
            sys::RemountFlags { read_only: true, nosuid: true, nodev: true, noexec: true, noatime: false }
        );
        let r = plan_remount(&cli(&["-o", "ro,noatime,remount,rw,suid"])).unwrap();
        assert_eq!(r.flags, sys::RemountFlags { noatime: true, ..Default::default() });
        // The daemon's settings: an option naming one must name what it has.
        let r = plan_remount(&cli(&["-o", "remount,ro,relaxed,threads=2,wear-aware,nonempty,log=/l"])).unwrap();
        let same = "mode=relaxed,threads=2,transport=auto,cached_inodes=65536,wear_aware=1,no_direct=0,writeback_cache=0";
        assert_eq!(contradicted(&r.expect, same), None);
        let other = same.replace("threads=2", "threads=8");
        let why = contradicted(&r.expect, &other).expect("threads differ");
        assert!(why.contains("option threads=2") && why.contains("threads=8"), "{why}");
        let r = plan_remount(&cli(&["-o", "remount,sync"])).unwrap();
        assert!(contradicted(&r.expect, same).expect("sync on relaxed").contains("mode=relaxed"));
        // ACLs, kept or not, are the daemon's too.
        let with_acls = format!("{same},acl=1");
        let r = plan_remount(&cli(&["-o", "remount,acl"])).unwrap();
        assert_eq!(contradicted(&r.expect, &with_acls), None);
        let r = plan_remount(&cli(&["-o", "remount,noacl"])).unwrap();
        assert!(contradicted(&r.expect, &with_acls).expect("noacl on an ACL mount").contains("acl=1"));
        let err = plan_remount(&cli(&["-o", "remount,compress"])).unwrap_err().err;
        assert!(err.contains("unknown to winefs"), "{err}");
        assert_eq!(plan_remount(&cli(&["-s", "-o", "remount,compress"])).unwrap().warnings.len(), 1);
    }

    #[test]
    fn combined_flags_parse_as_mount_passes_them() {
        let c = cli(&["-nv", "-o", "ro"]);
        assert!(c.no_mtab && c.verbose && !c.fake && !c.sloppy);
        assert!(!plan(&c, true).unwrap().args.quiet);
    }
}
