limits {
  max_connections_per_uid = -1
}
