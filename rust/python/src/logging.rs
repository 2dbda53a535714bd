//! Forwards the core's `log` records to Python's `logging` (logger "xla_pcache").

use pyo3::prelude::*;
use std::panic::{catch_unwind, AssertUnwindSafe};

struct PyLogger;

impl log::Log for PyLogger {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Info
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let level = match record.level() {
            log::Level::Error => 40,
            log::Level::Warn => 30,
            log::Level::Info => 20,
            _ => 10,
        };
        let msg = record.args().to_string();
        // Logging must never take the process down, whatever state the interpreter is in;
        // during shutdown (a store dropped at exit) `logging` may be gone: the record is lost.
        let _ = catch_unwind(AssertUnwindSafe(|| {
            Python::attach(|py| {
                let _ = py
                    .import("logging")
                    .and_then(|l| l.call_method1("getLogger", ("xla_pcache",)))
                    .and_then(|lg| lg.call_method1("log", (level, msg)));
            })
        }));
    }

    fn flush(&self) {}
}

static LOGGER: PyLogger = PyLogger;

pub fn install() {
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
}
