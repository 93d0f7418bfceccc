//! Entities the fast ticks make (the requests they issue): their
//! components wait in [`Joining`] while the fast ticks run, each joined to
//! the world by a command queued where it was made. The commands are
//! applied in order when the fast ticks stop, so the table gets the order
//! the list's systems give it (a fault sweeps the requests in that order).
//! Until then, the fast ticks look them up there too ([`WithJoining`]).

use bevy_ecs::component::Mutable;
use bevy_ecs::prelude::*;

/// Components of entities made in the fast ticks (reserved, not yet
/// spawned), in the order they were made.
#[derive(Resource)]
pub struct Joining<T: Component>(Vec<(Entity, T)>);

impl<T: Component> Default for Joining<T> {
    fn default() -> Self {
        Joining(Vec::new())
    }
}

impl<T: Component> Joining<T> {
    /// Keeps `item` as entity `id`'s (reserved by `commands`), and queues
    /// the command that joins it to the world: after what was queued
    /// before, before what is queued after.
    pub fn keep(&mut self, commands: &mut Commands, id: Entity, item: T) {
        self.0.push((id, item));
        commands.queue(move |world: &mut World| {
            let item = world.resource_mut::<Joining<T>>().take(id);
            world
                .entity_mut(id)
                .insert(item.expect("a component waiting to join"));
        });
    }

    fn take(&mut self, id: Entity) -> Option<T> {
        let at = self.0.iter().position(|(e, _)| *e == id)?;
        Some(self.0.swap_remove(at).1)
    }

    /// Whether every component kept has joined the world.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Where the systems find the components of type `T`: a query, or a query
/// and the components still joining.
pub trait Lookup<T> {
    fn find(&self, id: Entity) -> Option<&T>;
    fn find_mut(&mut self, id: Entity) -> Option<&mut T>;
}

impl<T: Component<Mutability = Mutable>> Lookup<T> for Query<'_, '_, &mut T> {
    fn find(&self, id: Entity) -> Option<&T> {
        self.get(id).ok()
    }
    fn find_mut(&mut self, id: Entity) -> Option<&mut T> {
        self.get_mut(id).ok().map(Mut::into_inner)
    }
}

/// A table (`S`) and the components joining it.
pub struct WithJoining<'a, S, T: Component> {
    pub table: &'a mut S,
    pub joining: &'a mut Joining<T>,
}

impl<T: Component, S: Lookup<T>> Lookup<T> for WithJoining<'_, S, T> {
    fn find(&self, id: Entity) -> Option<&T> {
        match self.table.find(id) {
            Some(item) => Some(item),
            None => self
                .joining
                .0
                .iter()
                .find(|(e, _)| *e == id)
                .map(|(_, t)| t),
        }
    }
    fn find_mut(&mut self, id: Entity) -> Option<&mut T> {
        // (Joining first: the table's borrow could not be given back.)
        if !self.joining.0.is_empty()
            && let Some((_, item)) = self.joining.0.iter_mut().find(|(e, _)| *e == id)
        {
            return Some(item);
        }
        self.table.find_mut(id)
    }
}
