//! Entities the fast ticks make (the requests and sessions they issue, the
//! leases their hand-offs grant): their components wait in [`Joining`]
//! while the fast ticks run, each joined to the world by a command queued
//! where it was made. The commands are applied in order when the fast
//! ticks stop, so the table gets the order the list's systems give it (a
//! fault sweeps the requests in that order). Until then, the fast ticks
//! look them up there too ([`WithJoining`]).

use std::collections::VecDeque;

use bevy_ecs::component::Mutable;
use bevy_ecs::entity::RemoteAllocator;
use bevy_ecs::prelude::*;

/// Where each of some entities is in a list of their own, by entity index:
/// a look-up reads one entry (the entity beside its place), not the list.
/// An entry is for that entity only, not for another generation of its
/// index.
#[derive(Default)]
pub(crate) struct Places {
    by_index: Vec<(Entity, u64)>,
}

impl Places {
    /// Entity `id` is at `place`.
    pub(crate) fn set(&mut self, id: Entity, place: u64) {
        let k = id.index_u32() as usize;
        if self.by_index.len() <= k {
            self.by_index.resize(k + 1, (Entity::PLACEHOLDER, 0));
        }
        self.by_index[k] = (id, place);
    }

    /// Where entity `id` is, if it is.
    #[inline]
    pub(crate) fn get(&self, id: Entity) -> Option<u64> {
        let &(kept, place) = self.by_index.get(id.index_u32() as usize)?;
        (kept == id).then_some(place)
    }

    /// Entity `id` is in the list no more.
    pub(crate) fn forget(&mut self, id: Entity) {
        self.by_index[id.index_u32() as usize] = (Entity::PLACEHOLDER, 0);
    }

    /// Entity `id`, in the list, moved one place up.
    fn move_up(&mut self, id: Entity) {
        self.by_index[id.index_u32() as usize].1 -= 1;
    }
}

/// Components of entities made in the fast ticks (reserved, not yet
/// spawned), in the order they were made. The fast ticks look entities up
/// here first, most of them not here, and keep a request here for most of
/// its life (their stretches are long): an entity is found by its index,
/// not by a scan.
#[derive(Resource)]
pub struct Joining<T: Component> {
    ids: VecDeque<Entity>,
    items: VecDeque<T>,
    /// The sequence number of each item, by its entity.
    seq_of: Places,
    /// The sequence number of the first item.
    front: u64,
    /// A handle on the world's entity allocator.
    allocator: RemoteAllocator,
}

impl<T: Component> Joining<T> {
    /// None kept yet, for `world`'s entities.
    pub fn new(world: &World) -> Self {
        Joining {
            ids: VecDeque::new(),
            items: VecDeque::new(),
            seq_of: Places::default(),
            front: 0,
            allocator: world.entity_allocator().build_remote_allocator(),
        }
    }

    /// An entity to keep a component for: allocated as
    /// `Commands::spawn_empty` allocates it (the same one), but spawned
    /// only with its component, by [`keep`](Self::keep)'s command, in one
    /// move rather than spawned empty and moved to its table.
    pub fn reserve(&self) -> Entity {
        self.allocator.alloc()
    }

    /// Gives back entity `id`, reserved and not kept: a command spawns it
    /// empty and despawns it, as `spawn_empty` and `despawn` would have
    /// (the allocator gets it back at that point, a generation on).
    pub fn give_back(&self, commands: &mut Commands, id: Entity) {
        commands.queue(move |world: &mut World| {
            world
                .spawn_empty_at(id)
                .expect("a reserved entity")
                .despawn();
        });
    }

    /// Keeps `item` as entity `id`'s ([`reserve`](Self::reserve)d), and
    /// queues the command that spawns it: after what was queued before,
    /// before what is queued after.
    pub fn keep(&mut self, commands: &mut Commands, id: Entity, item: T) {
        self.seq_of.set(id, self.front + self.ids.len() as u64);
        self.ids.push_back(id);
        self.items.push_back(item);
        commands.queue(move |world: &mut World| {
            let item = world.resource_mut::<Joining<T>>().take(id);
            world
                .spawn_at(id, item.expect("a component waiting to join"))
                .expect("a reserved entity");
        });
    }

    /// Entity `id`'s component, taken out. The commands join them in the
    /// order they were kept, so it is the first; were it not, the later
    /// ones move up one.
    fn take(&mut self, id: Entity) -> Option<T> {
        let at = self.position(id)?;
        self.seq_of.forget(id);
        self.ids.remove(at);
        if at == 0 {
            self.front += 1;
        } else {
            for later in self.ids.range(at..) {
                self.seq_of.move_up(*later);
            }
        }
        self.items.remove(at)
    }

    /// Where entity `id`'s component is, if it is here.
    #[inline]
    fn position(&self, id: Entity) -> Option<usize> {
        self.seq_of.get(id).map(|seq| (seq - self.front) as usize)
    }

    /// Whether every component kept has joined the world.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
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
            None => self.joining.position(id).map(|i| &self.joining.items[i]),
        }
    }
    fn find_mut(&mut self, id: Entity) -> Option<&mut T> {
        // (Joining first: the table's borrow could not be given back.)
        if !self.joining.is_empty()
            && let Some(i) = self.joining.position(id)
        {
            return Some(&mut self.joining.items[i]);
        }
        self.table.find_mut(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bevy_ecs::world::CommandQueue;

    #[derive(Component, Debug, PartialEq)]
    struct N(u32);

    #[test]
    fn a_joining_entity_is_found_by_its_index_and_joins_in_order() {
        let mut world = World::new();
        let mut queue = CommandQueue::default();
        let mut joining = Joining::<N>::new(&world);
        let [a, b, c, d] = std::array::from_fn(|_| joining.reserve());
        {
            let mut commands = Commands::new(&mut queue, &world);
            for (e, n) in [(a, 1), (b, 2), (c, 3)] {
                joining.keep(&mut commands, e, N(n));
            }
        }
        assert_eq!(
            [a, b, c, d].map(|e| joining.position(e)),
            [Some(0), Some(1), Some(2), None]
        );
        // The same index in another generation is another entity.
        let c_later =
            Entity::from_index_and_generation(c.index(), c.generation().after_versions(1));
        assert_eq!(joining.position(c_later), None);
        // Taken from the middle (the commands never do): c moves up one.
        assert_eq!(joining.take(b), Some(N(2)));
        assert_eq!(
            [a, b, c].map(|e| joining.position(e)),
            [Some(0), None, Some(1)]
        );
        assert_eq!(joining.take(a), Some(N(1)));
        assert_eq!(joining.position(c), Some(0));

        // The commands take them from the front, in the order kept, and
        // spawn them with their components.
        let mut queue = CommandQueue::default();
        let mut joining = Joining::<N>::new(&world);
        let [e, f, g] = std::array::from_fn(|_| joining.reserve());
        let mut commands = Commands::new(&mut queue, &world);
        for (id, n) in [(e, 4), (f, 5)] {
            joining.keep(&mut commands, id, N(n));
        }
        joining.give_back(&mut commands, g);
        world.insert_resource(joining);
        world.flush();
        queue.apply(&mut world);
        assert!(world.resource::<Joining<N>>().is_empty());
        assert_eq!(world.get::<N>(e), Some(&N(4)));
        assert_eq!(world.get::<N>(f), Some(&N(5)));
        assert!(world.get_entity(g).is_err());
        let ids: Vec<Entity> = world
            .query::<(Entity, &N)>()
            .iter(&world)
            .map(|(id, _)| id)
            .collect();
        assert_eq!(ids, [e, f]);
    }
}
