"""Supervision: the supervisor that launches torchrun, relaunches after failures and records
every attempt; warm standby; the run summary."""
