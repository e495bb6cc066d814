"""Operations: stats, stall alerts, reports, retention, archive, migrate, cancel and requeue."""
