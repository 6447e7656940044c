//! The naming rows of issue 37 in the configuration: a cluster's `view_id_header` and
//! `[naming] parent`, each mistake at its line, column and field path.

mod support;

fn cluster(lines: &str) -> String {
    format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:8080\"\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
         [cluster.c]\n{lines}\nmembers = [{{ name = \"a1\", address = \"127.0.0.1:9001\" }}]\n"
    )
}

#[test]
fn view_id_header_is_off_by_default_and_only_for_http_clusters() {
    let c = support::ok(&cluster(""));
    assert!(!c.view.clusters["c"].policy.view_id_header);
    let c = support::ok(&cluster("view_id_header = true"));
    assert!(c.view.clusters["c"].policy.view_id_header);
    let text = cluster("view_id_header = \"yes\"");
    support::fails_once(&text, "cluster.c.view_id_header", "\"yes\"", "boolean");
    let text = cluster("upstream_protocol = \"tcp\"\nview_id_header = true");
    support::fails_with(&text, "cluster.c.view_id_header", "true", "a tcp cluster has none");
}

#[test]
fn a_naming_parent_is_a_list_of_plain_http_endpoints_not_this_service() {
    let naming =
        |parent: &str| format!("[naming]\nlisten = \"127.0.0.1:7070\"\nparent = {parent}\n");
    let c = support::ok(&naming("[\"127.0.0.1:7071\", \"http://naming.up:80/\"]"));
    assert_eq!(c.naming.expect("naming").parent, ["127.0.0.1:7071", "http://naming.up:80"]);
    let c = support::ok("[naming]\nlisten = \"127.0.0.1:7070\"\n");
    assert!(c.naming.expect("naming").parent.is_empty());
    let text = naming("[\"127.0.0.1:7071\", \"up\"]");
    support::fails_once(&text, "naming.parent[1]", "\"up\"", "no port");
    let text = naming("[\"https://up:443\"]");
    support::fails_once(&text, "naming.parent[0]", "\"https://up:443\"", "plain HTTP");
    let text = naming("[\"127.0.0.1:7070\"]");
    let at = "\"127.0.0.1:7070\"]";
    support::fails_once(&text, "naming.parent[0]", at, "would ask itself");
    let text = naming("[\"a b:1\"]");
    support::fails_once(&text, "naming.parent[0]", "\"a b:1\"", "not a host name");
    let text = naming("\"127.0.0.1:7071\"");
    support::fails_once(&text, "naming.parent", "\"127.0.0.1:7071\"", "sequence");
}
