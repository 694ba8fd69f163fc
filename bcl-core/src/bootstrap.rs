//! Rendezvous: every rank publishes its [`RankInfo`] in the store and reads everyone else's,
//! within the init deadline; a rank that never arrives is named.

use crate::error::{Error, Result};
use crate::peers::RankInfo;
use bcl_transport::store::{Store, StoreError};
use std::time::Instant;

fn key(prefix: &str, rank: usize) -> String {
    format!("{prefix}/rank/{rank}")
}

/// Publish `me` and collect the infos of all `world` ranks, in rank order.
pub fn exchange(
    store: &dyn Store,
    prefix: &str,
    me: &RankInfo,
    world: usize,
    started: Instant,
    deadline: Instant,
) -> Result<Vec<RankInfo>> {
    let failed = |reason: String| Error::Bootstrap {
        rank: me.rank,
        reason,
    };
    let bytes = postcard::to_stdvec(me).map_err(|e| failed(format!("encoding rank info: {e}")))?;
    store
        .set(&key(prefix, me.rank), &bytes)
        .map_err(|e| failed(e.to_string()))?;
    let mut infos = Vec::with_capacity(world);
    for rank in 0..world {
        let raw = match store.get(&key(prefix, rank), deadline) {
            Ok(raw) => raw,
            Err(StoreError::Timeout { store: name, .. }) => {
                // Name every rank still missing, not only the first.
                let mut missing = Vec::new();
                for r in rank..world {
                    if !matches!(store.try_get(&key(prefix, r)), Ok(Some(_))) {
                        missing.push(r);
                    }
                }
                return Err(Error::BootstrapTimeout {
                    rank: me.rank,
                    missing,
                    waited_s: started.elapsed().as_secs_f64(),
                    detail: format!("rendezvous through the {name} store"),
                });
            }
            Err(e) => return Err(failed(e.to_string())),
        };
        let info: RankInfo = postcard::from_bytes(&raw)
            .map_err(|e| failed(format!("rank {rank}'s info is not valid: {e}")))?;
        if info.rank != rank {
            return Err(failed(format!(
                "store key of rank {rank} holds rank {}'s info",
                info.rank
            )));
        }
        infos.push(info);
    }
    Ok(infos)
}
