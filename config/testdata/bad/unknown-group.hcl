acl {
  admin_groups = ["root", "no-such-group-for-lockagent"]
}
