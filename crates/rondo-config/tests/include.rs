//! `include = ["conf.d/*.toml"]` (issue 38): the included files read after the main one, errors
//! at their own file, line and column, and the rules for what an included file may hold.

use std::path::PathBuf;

use rondo_config::{config_files, load_file};

/// A directory of its own under the system's temp dir, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("rondo-include-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("conf.d")).unwrap();
        Dir(d)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const MAIN: &str = "include = [\"conf.d/*.toml\"]\n\n\
                    [[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:8080\"\n";

const API: &str = "[[route]]\nlistener = \"web\"\ncluster = \"api\"\n\n\
                   [cluster.api]\nmembers = [{ name = \"a1\", address = \"127.0.0.1:9001\" }]\n";

#[test]
fn included_files_join_the_main_one_in_name_order() {
    let d = Dir::new("join");
    let main = d.write("rondo.toml", MAIN);
    d.write("conf.d/20-api.toml", API);
    d.write(
        "conf.d/10-admin.toml",
        "[cluster.spare]\nmembers = [{ name = \"s1\", address = \"127.0.0.1:9002\" }]\n",
    );
    d.write("conf.d/notes.txt", "not toml at all");
    let c = load_file(&main, 1).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.view.routes.len(), 1);
    assert!(c.view.clusters.contains_key("api") && c.view.clusters.contains_key("spare"));
    let files = config_files(&main);
    let names: Vec<_> =
        files.iter().map(|f| f.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["rondo.toml", "10-admin.toml", "20-api.toml"]);
    // An empty directory is fine.
    std::fs::remove_file(d.0.join("conf.d/20-api.toml")).unwrap();
    std::fs::remove_file(d.0.join("conf.d/10-admin.toml")).unwrap();
    let c = load_file(&main, 1).unwrap_or_else(|e| panic!("{e}"));
    assert!(c.view.routes.is_empty() && c.view.clusters.is_empty());
    assert_eq!(config_files(&main), vec![main.clone()]);
}

#[test]
fn an_error_in_an_included_file_names_that_file_line_and_column() {
    let d = Dir::new("errors");
    let main = d.write("rondo.toml", MAIN);
    let api = d.write("conf.d/api.toml", &API.replace("members", "\nmembres"));
    let errors = load_file(&main, 1).unwrap_err();
    let e = errors.iter().next().expect("an error");
    assert_eq!(e.file, api, "{errors}");
    assert_eq!((e.line, e.column), (7, 1), "{errors}");
    assert!(e.message.contains("did you mean `members`"), "{errors}");

    // A semantic error (a route to a cluster nobody has) too.
    std::fs::write(&api, API.replace("cluster = \"api\"", "cluster = \"nope\"")).unwrap();
    let errors = load_file(&main, 1).unwrap_err();
    let e = errors.iter().find(|e| e.field == "route[0].cluster").expect("the route's error");
    assert_eq!((e.file.as_path(), e.line, e.column), (api.as_path(), 3, 11), "{errors}");
}

#[test]
fn what_an_included_file_may_not_hold() {
    let d = Dir::new("rules");
    let main = d.write("rondo.toml", MAIN);
    let bad =
        d.write("conf.d/bad.toml", "include = [\"more.toml\"]\n\n[cluster.x]\nmembers = []\n");
    let errors = load_file(&main, 1).unwrap_err();
    let e = errors.iter().next().unwrap();
    assert_eq!((e.file.as_path(), e.line, e.column), (bad.as_path(), 1, 1), "{errors}");
    assert!(e.message.contains("holds tables only"), "{errors}");
    std::fs::remove_file(&bad).unwrap();

    // The same table in two files.
    d.write("conf.d/a.toml", API);
    let twice = d.write("conf.d/b.toml", API);
    let errors = load_file(&main, 1).unwrap_err();
    assert!(errors.iter().any(|e| e.file == twice && e.message.contains("duplicate")), "{errors}");
    std::fs::remove_file(&twice).unwrap();

    // A plain path that is not there.
    let main = d.write("other.toml", &MAIN.replace("conf.d/*.toml", "missing.toml"));
    let errors = load_file(&main, 1).unwrap_err();
    let e = errors.iter().next().unwrap();
    assert_eq!((e.file.as_path(), e.field.as_str()), (main.as_path(), "include[0]"), "{errors}");
    assert!(e.message.contains("no such file"), "{errors}");
}

#[test]
fn a_text_includes_nothing_and_devices_are_not_read() {
    let errors = rondo_config::parse_str(MAIN, std::path::Path::new("sent.toml"), 1).unwrap_err();
    let e = errors.iter().next().unwrap();
    assert_eq!((e.field.as_str(), e.line, e.column), ("include", 1, 11), "{errors}");
    assert!(e.message.contains("read from configuration files"), "{errors}");

    let d = Dir::new("devices");
    let main = d.write("rondo.toml", &MAIN.replace("conf.d/*.toml", "/dev/zero"));
    let errors = load_file(&main, 1).unwrap_err();
    let e = errors.iter().next().unwrap();
    assert_eq!(e.file, std::path::Path::new("/dev/zero"), "{errors}");
    assert!(e.message.contains("not a regular file"), "{errors}");
}
