limits {
  max_sessions_per_uid = -3
}
