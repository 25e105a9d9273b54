"""The stream processor, by role: `write/`, `respond/`, `jobs/`, `local/`.

Shared wiring sits beside them: the faust app (`app`) and the `RoleContext` the
roles share (`context`), the store service, settings, metrics, auth, codec, clock,
Kafka admin, partitioner, backoff, worker. Nothing here imports `dmem`, the user-facing
package on top.
"""
