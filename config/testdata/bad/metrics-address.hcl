metrics {
  address = "9464"
}
