acl {
  admin_uids = [0, -1]
}
