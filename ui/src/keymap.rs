//! Keys to actions, per mode, from a TOML file laid over the embedded defaults.

use crate::action::Action;
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use std::collections::BTreeMap;

pub const DEFAULT_KEYMAP: &str = include_str!("../../assets/keymap.default.toml");

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    Normal,
    Editor,
    Confirm,
    Help,
    /// Picking an answer from the agent's options.
    Choice,
}

impl Mode {
    const ALL: [Mode; 5] = [Mode::Normal, Mode::Editor, Mode::Confirm, Mode::Help, Mode::Choice];
    fn section(self) -> &'static str {
        match self {
            Mode::Normal => "normal",
            Mode::Editor => "editor",
            Mode::Confirm => "confirm",
            Mode::Help => "help",
            Mode::Choice => "choice",
        }
    }
}

/// A key as written in the keymap: code plus ctrl/alt (shift is part of the character).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub code: KeyCodeKey,
    pub ctrl: bool,
    pub alt: bool,
}

/// `KeyCode` is not `Ord`; this is the subset a keymap can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KeyCodeKey {
    Char(char),
    Enter,
    Esc,
    Tab,
    BackTab,
    Up,
    Down,
    Left,
    Right,
    PageUp,
    PageDown,
    Home,
    End,
    Backspace,
}

impl Key {
    pub fn parse(s: &str) -> Result<Key, String> {
        let mut ctrl = false;
        let mut alt = false;
        let mut rest = s;
        loop {
            if let Some(r) = rest.strip_prefix("ctrl-") {
                ctrl = true;
                rest = r;
            } else if let Some(r) = rest.strip_prefix("alt-") {
                alt = true;
                rest = r;
            } else {
                break;
            }
        }
        let code = match rest {
            "enter" => KeyCodeKey::Enter,
            "esc" => KeyCodeKey::Esc,
            "tab" => KeyCodeKey::Tab,
            "backtab" | "shift-tab" => KeyCodeKey::BackTab,
            "up" => KeyCodeKey::Up,
            "down" => KeyCodeKey::Down,
            "left" => KeyCodeKey::Left,
            "right" => KeyCodeKey::Right,
            "pageup" => KeyCodeKey::PageUp,
            "pagedown" => KeyCodeKey::PageDown,
            "home" => KeyCodeKey::Home,
            "end" => KeyCodeKey::End,
            "backspace" => KeyCodeKey::Backspace,
            "space" => KeyCodeKey::Char(' '),
            s if s.chars().count() == 1 => KeyCodeKey::Char(s.chars().next().unwrap_or(' ')),
            other => return Err(format!("unknown key '{other}' in '{s}'")),
        };
        Ok(Key { code, ctrl, alt })
    }

    pub fn from_event(ev: &KeyEvent) -> Option<Key> {
        let code = match ev.code {
            KeyCode::Char(c) => KeyCodeKey::Char(c),
            KeyCode::Enter => KeyCodeKey::Enter,
            KeyCode::Esc => KeyCodeKey::Esc,
            KeyCode::Tab => KeyCodeKey::Tab,
            KeyCode::BackTab => KeyCodeKey::BackTab,
            KeyCode::Up => KeyCodeKey::Up,
            KeyCode::Down => KeyCodeKey::Down,
            KeyCode::Left => KeyCodeKey::Left,
            KeyCode::Right => KeyCodeKey::Right,
            KeyCode::PageUp => KeyCodeKey::PageUp,
            KeyCode::PageDown => KeyCodeKey::PageDown,
            KeyCode::Home => KeyCodeKey::Home,
            KeyCode::End => KeyCodeKey::End,
            KeyCode::Backspace => KeyCodeKey::Backspace,
            _ => return None,
        };
        Some(Key {
            code,
            ctrl: ev.modifiers.contains(KeyModifiers::CONTROL),
            alt: ev.modifiers.contains(KeyModifiers::ALT),
        })
    }

    pub fn label(&self) -> String {
        let base = match self.code {
            KeyCodeKey::Char(' ') => "space".to_owned(),
            KeyCodeKey::Char(c) => c.to_string(),
            KeyCodeKey::Enter => "Enter".into(),
            KeyCodeKey::Esc => "Esc".into(),
            KeyCodeKey::Tab => "Tab".into(),
            KeyCodeKey::BackTab => "Shift-Tab".into(),
            KeyCodeKey::Up => "↑".into(),
            KeyCodeKey::Down => "↓".into(),
            KeyCodeKey::Left => "←".into(),
            KeyCodeKey::Right => "→".into(),
            KeyCodeKey::PageUp => "PgUp".into(),
            KeyCodeKey::PageDown => "PgDn".into(),
            KeyCodeKey::Home => "Home".into(),
            KeyCodeKey::End => "End".into(),
            KeyCodeKey::Backspace => "Backspace".into(),
        };
        format!(
            "{}{}{base}",
            if self.ctrl { "Ctrl-" } else { "" },
            if self.alt { "Alt-" } else { "" }
        )
    }
}

#[derive(Debug, Clone)]
pub struct Keymap {
    bindings: BTreeMap<(Mode, Key), Action>,
}

impl Keymap {
    /// The embedded defaults with `user` (a keymap file's text) laid over them. Every error names
    /// the mode, the key and what was wrong.
    pub fn load(user: Option<&str>) -> Result<Keymap, String> {
        let mut km = Keymap { bindings: BTreeMap::new() };
        km.overlay(DEFAULT_KEYMAP, "the default keymap")?;
        if let Some(text) = user {
            km.overlay(text, "keymap.toml")?;
        }
        Ok(km)
    }

    fn overlay(&mut self, text: &str, origin: &str) -> Result<(), String> {
        let table: toml::Table = toml::from_str(text).map_err(|e| format!("{origin}: {e}"))?;
        for (section, entries) in table {
            let mode = Mode::ALL.into_iter().find(|m| m.section() == section).ok_or_else(|| {
                format!(
                    "{origin}: unknown section [{section}]; use normal, editor, confirm or help"
                )
            })?;
            let entries = entries.as_table().ok_or_else(|| {
                format!("{origin}: [{section}] must be a table of \"key\" = \"action\"")
            })?;
            for (key, action) in entries {
                let k = Key::parse(key).map_err(|e| format!("{origin} [{section}]: {e}"))?;
                let name = action.as_str().ok_or_else(|| {
                    format!("{origin} [{section}] \"{key}\": the action must be a string")
                })?;
                if name == "none" {
                    self.bindings.remove(&(mode, k));
                    continue;
                }
                let a = Action::from_name(name).ok_or_else(|| {
                    let near: Vec<&str> = Action::ALL
                        .iter()
                        .map(|a| a.name())
                        .filter(|n| n.split('-').any(|w| name.contains(w)))
                        .collect();
                    format!(
                        "{origin} [{section}] \"{key}\": unknown action '{name}'{}",
                        if near.is_empty() {
                            String::new()
                        } else {
                            format!("; did you mean '{}'?", near.join("' or '"))
                        }
                    )
                })?;
                self.bindings.insert((mode, k), a);
            }
        }
        Ok(())
    }

    pub fn resolve(&self, mode: Mode, ev: &KeyEvent) -> Option<Action> {
        let key = Key::from_event(ev)?;
        self.bindings.get(&(mode, key)).copied()
    }

    /// Keys bound to each action in `mode`, for the help screen and the hint bar.
    pub fn keys_for(&self, mode: Mode) -> Vec<(Action, Vec<String>)> {
        let mut by_action: BTreeMap<usize, (Action, Vec<Key>)> = BTreeMap::new();
        for ((m, key), action) in &self.bindings {
            if *m != mode {
                continue;
            }
            let idx = Action::ALL.iter().position(|a| a == action).unwrap_or(usize::MAX);
            by_action.entry(idx).or_insert_with(|| (*action, Vec::new())).1.push(*key);
        }
        by_action
            .into_values()
            .map(|(a, mut keys)| {
                // Plain keys first: they are what the hint bar should show.
                keys.sort_by_key(|k| (k.ctrl || k.alt, !matches!(k.code, KeyCodeKey::Char(_))));
                (a, keys.iter().map(Key::label).collect())
            })
            .collect()
    }

    pub fn first_key(&self, mode: Mode, action: Action) -> Option<String> {
        self.keys_for(mode)
            .into_iter()
            .find(|(a, _)| *a == action)
            .and_then(|(_, k)| k.into_iter().next())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_keymap_loads_and_binds_the_documented_keys() {
        let km = Keymap::load(None).unwrap();
        let ev = |c: KeyCode, m: KeyModifiers| KeyEvent::new(c, m);
        assert_eq!(
            km.resolve(Mode::Normal, &ev(KeyCode::Char('j'), KeyModifiers::NONE)),
            Some(Action::SelectNext)
        );
        assert_eq!(
            km.resolve(Mode::Normal, &ev(KeyCode::BackTab, KeyModifiers::SHIFT)),
            Some(Action::FocusPrev)
        );
        assert_eq!(
            km.resolve(Mode::Normal, &ev(KeyCode::Char('N'), KeyModifiers::SHIFT)),
            Some(Action::AddTaskNote)
        );
        assert_eq!(
            km.resolve(Mode::Editor, &ev(KeyCode::Char('s'), KeyModifiers::CONTROL)),
            Some(Action::Send)
        );
        assert_eq!(
            km.resolve(Mode::Confirm, &ev(KeyCode::Char('y'), KeyModifiers::NONE)),
            Some(Action::Confirm)
        );
    }

    #[test]
    fn a_user_keymap_rebinds_and_unbinds() {
        let km =
            Keymap::load(Some("[normal]\n\"x\" = \"cancel-task\"\n\"c\" = \"none\"\n")).unwrap();
        let ev = |c: char| KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE);
        assert_eq!(km.resolve(Mode::Normal, &ev('x')), Some(Action::CancelTask));
        assert_eq!(km.resolve(Mode::Normal, &ev('c')), None);
    }

    #[test]
    fn bad_keymaps_say_what_is_wrong() {
        let err = Keymap::load(Some("[normal]\n\"x\" = \"cancle-task\"\n")).unwrap_err();
        assert!(
            err.contains("unknown action 'cancle-task'") && err.contains("did you mean"),
            "{err}"
        );
        let err = Keymap::load(Some("[nromal]\n")).unwrap_err();
        assert!(err.contains("unknown section [nromal]"), "{err}");
        let err = Keymap::load(Some("[normal]\n\"hyper-x\" = \"quit\"\n")).unwrap_err();
        assert!(err.contains("unknown key"), "{err}");
    }
}
