//! How a command fails: what it was doing, the library's error, and the exit code; printed by
//! `main` as one line, `winefs: <what>: <why>`.

/// A failure: what was being done, and the library's error.
#[derive(Debug)]
pub(crate) struct Fail {
    pub(crate) what: String,
    pub(crate) err: String,
    pub(crate) code: u8,
}

/// A failure with exit code 1.
pub(crate) fn fail(what: impl Into<String>, e: impl std::fmt::Display) -> Fail {
    Fail {
        what: what.into(),
        err: e.to_string(),
        code: 1,
    }
}

/// Name what was being done when a library call fails.
pub(crate) trait Ctx<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T, Fail>;
}

impl<T> Ctx<T> for winefs::Result<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T, Fail> {
        self.map_err(|e| fail(what(), e))
    }
}
