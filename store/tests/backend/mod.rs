//! The two backends every store test runs against: SQLite on a real file
//! and a real PostgreSQL server (`sharedos_store::cluster`).

pub mod records;

use std::sync::Arc;

use sharedos_store::cluster::TestDatabase;
use sharedos_store::{PostgresStore, SqliteOptions, SqliteStore, Store};

pub enum Backend {
    Sqlite(tempfile::TempDir),
    Postgres(TestDatabase),
}

impl Backend {
    pub fn sqlite() -> Self {
        Backend::Sqlite(tempfile::tempdir().unwrap())
    }
    pub async fn postgres() -> Self {
        Backend::Postgres(TestDatabase::new().await.unwrap())
    }
    /// A new store (a new connection) on the same database.
    pub async fn open_keeping(&self, keep: Option<u64>) -> Arc<dyn Store> {
        match self {
            Backend::Sqlite(dir) => Arc::new(
                SqliteStore::open(
                    dir.path().join("sharedos.db"),
                    SqliteOptions {
                        keep_events_per_run: keep,
                        ..SqliteOptions::default()
                    },
                )
                .unwrap(),
            ),
            Backend::Postgres(db) => {
                Arc::new(PostgresStore::connect(&db.conninfo, keep).await.unwrap())
            }
        }
    }
    pub async fn open(&self) -> Arc<dyn Store> {
        self.open_keeping(None).await
    }
}

/// Runs one test body against each backend.
macro_rules! both {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                super::$name(super::Backend::sqlite()).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                super::$name(super::Backend::postgres().await).await
            }
        }
    };
}
