metrics {
  address = "127.0.0.1:99999"
}
